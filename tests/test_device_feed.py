"""The device stage (shard_readers/device_feed.py) on this machine's CPU: `prefetch_to_device`
hands over every batch unchanged and in order, `DeviceResident` serves every row once an
epoch in a seeded order shuffled where the data lives, `TorchDataset`'s transform runs in the
workers; `python -m bench gpu-feed` runs its tabular and image workloads with no TensorFlow. The
CUDA stream path and the GPU JPEG decode run on a GPU only (`python -m bench gpu-feed` there)."""
from __future__ import annotations

import glob
import os
import re

import numpy as np
import pytest

from shard_readers import device_feed, numpy_reader

torch = pytest.importorskip("torch")


def split_files(examples: str) -> list[str]:
    return sorted(glob.glob(os.path.join(examples, "Split-*", "*")))


def test_prefetch_on_cpu_passes_every_batch_through_in_order(airquality_examples):
    files = split_files(airquality_examples)
    loader = torch.utils.data.DataLoader(numpy_reader.TorchDataset(files, batch_size=16),
                                         batch_size=None, num_workers=2)
    direct = list(loader)
    staged = list(device_feed.prefetch_to_device(loader, "cpu"))
    assert len(staged) == len(direct) > 5
    for ours, theirs in zip(staged, direct):
        assert ours.keys() == theirs.keys()
        for name in theirs:
            assert torch.equal(ours[name], theirs[name]), name
    # Numpy batches (iter_batches, for JAX and plain loops) become tensors; nesting is kept.
    arrays = list(numpy_reader.iter_batches(files, batch_size=50))
    pairs = list(device_feed.prefetch_to_device(
        ((batch, batch["Ozone"]) for batch in arrays), torch.device("cpu")))
    for (features, label), batch in zip(pairs, arrays):
        assert isinstance(label, torch.Tensor) and label.tolist() == batch["Ozone"].tolist()
        assert features["Wind"].numpy().tobytes() == batch["Wind"].tobytes()


def test_bytes_features_pass_through_the_prefetch_stage():
    names = np.array([b"a", b"b"], dtype=object)
    (batch,) = device_feed.prefetch_to_device([{"name": names, "n": np.arange(2)}], "cpu")
    assert batch["name"] is names and batch["n"].tolist() == [0, 1]


def test_work_on_the_device_runs_ahead_in_its_own_thread_on_every_batch_in_order(
        airquality_examples):
    """`on_device` sees each batch once, with its tensors on the device, in a thread that is
    never more than `ahead` batches (plus the one it is making) ahead of the batch the caller
    holds; the caller gets what it returns, in order, for two epochs of a DataLoader with
    persistent workers."""
    import threading
    import time

    files = split_files(airquality_examples)
    loader = torch.utils.data.DataLoader(
        numpy_reader.TorchDataset(files, batch_size=16, seed=4), batch_size=None,
        num_workers=2, persistent_workers=True)
    caller = threading.get_ident()
    made, taken, lead = [], [], []

    def on_device(batch):
        assert isinstance(batch["Ozone"], torch.Tensor)
        made.append(threading.get_ident())
        lead.append(len(made) - len(taken))
        return {"wind_doubled": batch["Wind"] * 2, "rows": len(batch["Wind"])}

    for epoch in range(2):
        loader.dataset.set_epoch(epoch)
        direct = list(loader)
        made.clear()
        taken.clear()
        for got in device_feed.prefetch_to_device(loader, "cpu", on_device=on_device,
                                                  ahead=2):
            time.sleep(0.05)  # a slow step: the thread runs as far ahead as it may
            taken.append(got)
        assert len(taken) == len(direct) > 5
        for got, batch in zip(taken, direct):
            assert torch.equal(got["wind_doubled"], batch["Wind"] * 2)
        assert caller not in made and len(set(made)) == 1
        # At most `ahead` waiting, one being made, one in the caller's hands; with a slow
        # caller it runs ahead (how far within the bound depends on the loader's workers
        # keeping up, which a busy machine may not let them).
        assert 3 <= max(lead) <= 2 + 2, lead


def test_an_error_ahead_reaches_the_caller_at_its_batch_and_stopping_early_ends_the_thread():
    import threading

    def failing(batch):
        if int(batch["n"][0]) == 3:
            raise KeyError("bad batch 3")
        return batch

    got = []
    with pytest.raises(KeyError, match="bad batch 3"):
        for batch in device_feed.prefetch_to_device(
                ({"n": np.array([i])} for i in range(10)), "cpu", on_device=failing):
            got.append(int(batch["n"][0]))
    assert got == [0, 1, 2]

    read = []

    def endless():
        while True:
            read.append(len(read))
            yield {"n": np.array([len(read)])}

    before = {t.ident for t in threading.enumerate()}
    stage = device_feed.prefetch_to_device(endless(), "cpu", on_device=lambda b: b, ahead=2)
    assert [int(next(stage)["n"][0]) for _ in range(3)] == [1, 2, 3]
    stage.close()
    assert {t.ident for t in threading.enumerate()} == before
    assert len(read) <= 3 + 2 + 1
    with pytest.raises(ValueError, match="ahead=0"):
        next(device_feed.prefetch_to_device([], "cpu", on_device=lambda b: b, ahead=0))


def test_a_resident_dataset_serves_every_row_once_an_epoch_in_a_seeded_order(
        airquality_examples):
    files = split_files(airquality_examples)
    all_ids = sorted(int(i) for batch in numpy_reader.iter_batches(files)
                     for i in batch["column_1"])
    resident = device_feed.DeviceResident(numpy_reader.iter_batches(files, batch_size=40),
                                          "cpu", batch_size=16, seed=9)
    assert resident.rows == len(all_ids) and len(resident) == -(-len(all_ids) // 16)
    orders = []
    for epoch in range(3):
        resident.set_epoch(epoch)
        batches = list(resident)
        assert [len(b["Ozone"]) for b in batches[:-1]] == [16] * (len(batches) - 1)
        orders.append([int(i) for b in batches for i in b["column_1"]])
        assert sorted(orders[-1]) == all_ids
    assert len({tuple(order) for order in orders}) == 3 and orders[0] != all_ids
    again = device_feed.DeviceResident(numpy_reader.iter_batches(files), "cpu",
                                       batch_size=16, seed=9)
    again.set_epoch(1)
    assert [int(i) for b in again for i in b["column_1"]] == orders[1]
    # Rows stay whole: every column of a row moves with its id.
    by_id = {int(i): float(w) for b in numpy_reader.iter_batches(files)
             for i, w in zip(b["column_1"], b["Wind"])}
    assert all(by_id[int(i)] == float(w) for b in again for i, w in zip(b["column_1"],
                                                                          b["Wind"]))
    dropped = device_feed.DeviceResident(numpy_reader.iter_batches(files), "cpu",
                                         batch_size=16, seed=9, drop_last=True)
    assert {len(b["Ozone"]) for b in dropped} == {16}
    assert len(dropped) == len(all_ids) // 16


def test_a_resident_dataset_keeps_raw_images_and_serves_each_once_an_epoch(tmp_path):
    """Raw-pixel records read as uint8 [rows, h, w, c] can live on the device: every image
    once an epoch, pixels and label together."""
    from bench import gpu_feed
    from tfrecord_shards.codec import schema_file

    data = gpu_feed.write_image_data(30, str(tmp_path), size=20, crop=16, processes=1)
    batches = list(numpy_reader.iter_batches(data.raw_files,
                                             schema_file.load_schema(data.raw_schema), 8))
    by_pixels = {b.tobytes(): int(y) for batch in batches
                 for b, y in zip(batch["image"], batch["label"])}
    assert len(by_pixels) == 30
    resident = device_feed.DeviceResident(batches, "cpu", batch_size=8, seed=1)
    for epoch in range(2):
        resident.set_epoch(epoch)
        served = [(image.numpy().tobytes(), int(label)) for batch in resident
                  for image, label in zip(batch["image"], batch["label"])]
        assert sorted(served) == sorted(by_pixels.items())
        assert all(batch["image"].dtype == torch.uint8 for batch in resident)


def test_a_resident_dataset_refuses_features_it_cannot_index_by_row():
    with pytest.raises(ValueError, match="'tags' has several values a row"):
        device_feed.DeviceResident([{"tags": np.arange(3), "tags__lengths": np.array([3])}],
                                   "cpu")
    with pytest.raises(ValueError, match="'name' is bytes"):
        device_feed.DeviceResident([{"name": np.array([b"x"], dtype=object)}], "cpu")


@pytest.mark.slow
def test_bench_gpu_feed_runs_here_without_tensorflow_and_names_its_device(tmp_path):
    """`python -m bench gpu-feed` with small settings, TensorFlow blocked in its process as on
    a machine without it: the three rates, the waiting share, the device it ran on, and an
    epoch of batches of one size but the last."""
    import json
    import subprocess
    import sys

    code = ("import sys, runpy; sys.modules['tensorflow'] = None\n"
            "runpy.run_module('bench', run_name='__main__', alter_sys=True)")
    args = ["gpu-feed", "--rows", "20000", "--batch-size", "2048", "--workers", "2",
            "--hidden", "32,16", "--work-dir", str(tmp_path)]
    result = subprocess.run([sys.executable, "-c", code, *args, "--json"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["device"] == ("cpu" if not torch.cuda.is_available()
                                else torch.cuda.get_device_name())
    paths = report["paths"]
    per_feature = "reader alone, a tensor per feature"
    assert set(paths) == {"model alone", per_feature, "reader alone", "end to end",
                          "device resident"}
    assert all(path["rows_per_second"] > 0 for path in paths.values())
    assert paths["reader alone"]["rows"] == paths["end to end"]["rows"] == \
        paths[per_feature]["rows"] == paths["device resident"]["rows"] == 20000
    assert paths["device resident"]["load_seconds"] > 0
    assert paths["reader alone"]["batch_sizes"] == paths[per_feature]["batch_sizes"] == \
        [20000 % 2048, 2048]
    end_to_end = paths["end to end"]
    assert 0 <= end_to_end["waiting_at_start_fraction"] <= end_to_end["waiting_fraction"] < 1
    table = subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                           text=True)
    assert table.returncode == 0, table.stderr[-3000:]
    assert "waiting for input" in table.stdout
    # A run of its own: its shares, not the report's.
    assert re.search(r"end to end .* \d+\.\d% \(\d+\.\d% at start\)", table.stdout)
    assert f"device: {report['device']};" in table.stdout


def tag_with_worker(batch: dict) -> dict:
    """A TorchDataset transform: the batch with the id of the worker that made it."""
    info = torch.utils.data.get_worker_info()
    return {**batch, "worker": np.full(len(batch["Ozone"]), info.id if info else -1)}


def test_a_transform_runs_on_each_batch_in_the_workers_and_keeps_its_size(
        airquality_examples):
    files = split_files(airquality_examples)
    all_ids = sorted(int(i) for batch in numpy_reader.iter_batches(files)
                     for i in batch["column_1"])
    dataset = numpy_reader.TorchDataset(files, batch_size=16, seed=3,
                                        transform=tag_with_worker)
    batches = list(torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2))
    assert {int(w) for b in batches for w in b["worker"]} == {0, 1}
    assert sorted(int(i) for b in batches for i in b["column_1"]) == all_ids
    sizes = [len(b["worker"]) for b in batches]
    assert sorted(set(sizes)) == sorted({16, len(all_ids) % 16} - {0})
    assert sizes.count(len(all_ids) % 16) <= 1


def test_stacked_features_are_one_matrix_of_the_readers_values_every_row_once(
        airquality_examples):
    """`StackFeatures` in two DataLoader workers: the named features (missing values filled
    as the reader fills them) as one float32 [rows, columns] matrix in the order named, the
    other features kept; every row once. Features of several values a row, bytes and names
    not in the batch are refused in one line."""
    files = split_files(airquality_examples)
    names = ["Ozone", "Wind", "Temp"]
    direct = list(numpy_reader.iter_batches(files, batch_size=1000))
    assert len(direct) == 1
    by_id = {int(i): row for i, row in zip(direct[0]["column_1"], np.stack(
        [direct[0][name].astype(np.float32) for name in names], 1))}
    dataset = numpy_reader.TorchDataset(files, batch_size=16, seed=2,
                                        transform=numpy_reader.StackFeatures(names))
    batches = list(torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2))
    ids = [int(i) for batch in batches for i in batch["column_1"]]
    assert sorted(ids) == sorted(by_id)
    for batch in batches:
        assert batch["features"].dtype == torch.float32 and batch["features"].shape[1] == 3
        assert not set(names) & set(batch) and "Solar.R" in batch
        for i, row in zip(batch["column_1"], batch["features"]):
            assert row.numpy().tolist() == by_id[int(i)].tolist()
    stack = numpy_reader.StackFeatures(["a", "b"], into="x", dtype=np.float64)
    fixed = stack({"a": np.arange(4).reshape(2, 2), "b": np.array([0.5, 1.5], np.float32)})
    assert fixed["x"].tolist() == [[0, 1, 0.5], [2, 3, 1.5]] and fixed["x"].dtype == np.float64
    with pytest.raises(ValueError, match="'a' has several values a row"):
        stack({"a": np.arange(3), "a__lengths": np.array([3]), "b": np.array([1.0])})
    with pytest.raises(ValueError, match="'b' is bytes"):
        stack({"a": np.array([1]), "b": np.array([b"x"], dtype=object)})
    with pytest.raises(KeyError, match=r"features \['b'\] are not in the batch"):
        stack({"a": np.array([1])})


def test_large_records_are_decoded_a_few_megabytes_at_a_time():
    records = [numpy_reader._Record("f", offset, b"x" * 1000) for offset in range(10)]
    assert [len(g) for g in numpy_reader._groups(iter(records), 4, max_bytes=2500)] == \
        [3, 3, 3, 1]
    assert [len(g) for g in numpy_reader._groups(iter(records), 4)] == [4, 4, 2]


def test_the_device_crop_cuts_each_images_window_in_one_gather():
    from shard_readers.jpeg_crops import crop_windows

    images = torch.randint(0, 256, (5, 3, 10, 12), dtype=torch.uint8)
    tops, lefts = torch.tensor([0, 1, 2, 3, 4]), torch.tensor([0, 2, 4, 6, 1])
    flips = torch.tensor([True, False, True, False, True])
    cropped = crop_windows(images, tops, lefts, flips, 6)
    assert cropped.shape == (5, 6, 6, 3)
    for i in range(5):
        window = images[i, :, tops[i]:tops[i] + 6, lefts[i]:lefts[i] + 6].permute(1, 2, 0)
        assert torch.equal(cropped[i], window.flip(1) if flips[i] else window)


def run_bench_without_tensorflow(*args: str):
    """`python -m bench *args` in a child process where importing TensorFlow fails, which writes the
    TensorFlow modules it holds at exit to stderr (a module that swallowed the failed import
    would still be caught importing it)."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['tensorflow'] = None\n"
            "from bench.cli import bench\n"
            "try:\n"
            "    bench(prog_name='python -m bench')\n"
            "finally:\n"
            "    held = sorted(m for m in sys.modules if m.split('.')[0] == 'tensorflow'\n"
            "                  and sys.modules[m] is not None)\n"
            "    print('tensorflow modules held:', held, file=sys.stderr)")
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                          text=True)


@pytest.mark.slow
def test_bench_gpu_feed_images_reads_every_image_once_with_each_decode(tmp_path):
    """The image workload with tiny settings (100 64x64 JPEGs and their raw 56x56 twins, the
    small CNN, 2 workers), TensorFlow blocked in its process and its workers: PIL decode in
    the workers and raw pixels each read every image once an epoch, in batches of one size
    but the last, on the device named."""
    import json

    from bench import gpu_feed

    result = run_bench_without_tensorflow(
        "gpu-feed", "--workload", "images", "--images", "100", "--image-size", "64",
        "--crop", "56", "--batch-size", "32", "--workers", "2", "--decode", "cpu,raw",
        "--model", "small-conv", "--work-dir", str(tmp_path), "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "tensorflow modules held: []" in result.stderr
    report = json.loads(result.stdout)
    assert report["device"] == ("cpu" if not torch.cuda.is_available()
                                else torch.cuda.get_device_name())
    paths = report["paths"]
    assert set(paths) == {"model alone", "reader alone (cpu)", "end to end (cpu)",
                          "reader alone (raw)", "end to end (raw)"}
    assert all(path["rows_per_second"] > 0 for path in paths.values())
    for decode in ("cpu", "raw"):
        assert paths[f"reader alone ({decode})"]["rows"] == 100
        assert paths[f"end to end ({decode})"]["rows"] == 100
        assert paths[f"reader alone ({decode})"]["batch_sizes"] == [100 % 32, 32]
        end_to_end = paths[f"end to end ({decode})"]
        assert 0 <= end_to_end["waiting_at_start_fraction"] <= \
            end_to_end["waiting_fraction"] < 1
    assert report["jpeg_bytes_per_image"] > 1000  # noise keeps JPEGs photograph-like
    table = gpu_feed.table(report)
    assert table.summary.startswith(f"device: {report['device']};")
    assert list(table.rows) == list(paths)


def test_bench_gpu_feed_images_says_in_one_line_what_the_machine_lacks(tmp_path):
    base = ["gpu-feed", "--workload", "images", "--images", "8", "--work-dir",
            str(tmp_path)]
    on_cpu = run_bench_without_tensorflow(*base, "--decode", "gpu", "--device", "cpu")
    assert on_cpu.returncode != 0
    assert "Error: --decode gpu decodes on a CUDA device; this run's device is cpu" in \
        on_cpu.stderr
    wrong = run_bench_without_tensorflow(*base, "--decode", "cpu,jpeg")
    assert wrong.returncode != 0 and "each one of cpu, gpu, raw" in wrong.stderr
    try:
        import torchvision  # noqa: F401
    except Exception:  # not installed, or a build that does not load against this torch
        no_torchvision = run_bench_without_tensorflow(*base, "--model", "resnet50",
                                                     "--device", "cpu")
        assert no_torchvision.returncode != 0
        assert "--model resnet50 needs torchvision" in no_torchvision.stderr
    assert not os.listdir(tmp_path)  # refused before any image was written


def pil_decode_jpeg(tensors: list, device) -> list:
    """What `jpeg_crops.device_jpeg_decoder` gives on CUDA (torchvision's batched
    decode_jpeg, RGB), made with PIL: same arguments, same results."""
    import io

    from PIL import Image

    return [torch.from_numpy(np.array(Image.open(io.BytesIO(t.numpy().tobytes()))
                                      .convert("RGB"))).permute(2, 0, 1).to(device)
            for t in tensors]


def jpeg(pixels: np.ndarray) -> bytes:
    import io

    from PIL import Image

    encoded = io.BytesIO()
    Image.fromarray(pixels).save(encoded, "JPEG", quality=95)
    return encoded.getvalue()


def is_window(crop: np.ndarray, image: np.ndarray) -> bool:
    """Whether `crop` is a window of `image`, as it is or flipped left-right."""
    size = crop.shape[0]
    return any(np.array_equal(crop, window) or np.array_equal(crop, window[:, ::-1])
               for top in range(image.shape[0] - size + 1)
               for left in range(image.shape[1] - size + 1)
               for window in [image[top:top + size, left:left + size]])


@pytest.mark.parametrize("side", ["host", "device"])
def test_jpeg_crops_are_windows_of_each_image_in_colour_other_features_kept(side,
                                                                            monkeypatch):
    """Both sides of `jpeg_crops` on a batch of JPEGs of two sizes, one of them grey (the
    device side with PIL standing in for nvJPEG): each crop is a window of its own image
    decoded as RGB, flipped or not; the label passes as it came; an image smaller than the
    crop is named by its row and size."""
    import io

    from PIL import Image

    from shard_readers import jpeg_crops

    monkeypatch.setattr(jpeg_crops, "device_jpeg_decoder", lambda device: pil_decode_jpeg)
    rng = np.random.default_rng(5)
    images = [rng.integers(0, 256, (12, 10, 3), np.uint8),
              rng.integers(0, 256, (9, 11), np.uint8),
              rng.integers(0, 256, (12, 10, 3), np.uint8)]
    encoded = np.array([jpeg(image) for image in images], dtype=object)
    decoded = [np.asarray(Image.open(io.BytesIO(data)).convert("RGB")) for data in encoded]
    labels = np.array([7, 8, 9])
    crops = jpeg_crops.JpegCropsOnHost("image", 6) if side == "host" else \
        jpeg_crops.JpegCropsOnDevice("image", 6, "cpu", seed=1)
    flipped = set()
    for _ in range(4):
        batch = crops({"image": encoded, "label": labels})
        assert batch["label"] is labels
        cut = np.asarray(batch["image"])
        assert cut.shape == (3, 6, 6, 3) and cut.dtype == np.uint8
        for row in range(3):
            assert is_window(cut[row], decoded[row]), row
            flipped.add(any(np.array_equal(cut[row], decoded[row][t:t + 6, l:l + 6])
                            for t in range(decoded[row].shape[0] - 5)
                            for l in range(decoded[row].shape[1] - 5)))
    assert flipped == {True, False}  # windows drawn both ways round over 12 crops
    same_size = crops({"image": encoded[[0, 2]]})["image"]  # one gather on the device side
    assert all(is_window(np.asarray(same_size)[i], decoded[i * 2]) for i in range(2))
    with pytest.raises(ValueError, match=r"'image': the image in row 1 of the batch is 9x11, "
                                         r"smaller than the 10x10 crop"):
        (jpeg_crops.JpegCropsOnHost("image", 10) if side == "host" else
         jpeg_crops.JpegCropsOnDevice("image", 10, "cpu"))({"image": encoded})


def test_the_gpu_decode_path_runs_here_with_pil_standing_in_for_nvjpeg(tmp_path, monkeypatch):
    """`--decode gpu` needs torchvision and CUDA; its wiring (JPEG bytes through the workers
    and the device stage, decoded and cropped in the training process) runs here with a PIL
    function in place of `torchvision.io.decode_jpeg`, same arguments and results."""
    from bench import gpu_feed
    from shard_readers import jpeg_crops
    from tfrecord_shards.codec import schema_file

    monkeypatch.setattr(jpeg_crops, "device_jpeg_decoder", lambda device: pil_decode_jpeg)
    report = gpu_feed.run_image_benchmark(70, str(tmp_path), batch_size=16, workers=2,
                                          decodes=["gpu"], image_size=48, crop=40,
                                          device="cpu", log=lambda line: None)
    paths = report["paths"]
    assert paths["reader alone (gpu)"]["rows"] == paths["end to end (gpu)"]["rows"] == 70
    assert paths["reader alone (gpu)"]["batch_sizes"] == [70 % 16, 16]
    assert 0 <= paths["end to end (gpu)"]["waiting_fraction"] < 1
    decoder = jpeg_crops.JpegCropsOnDevice("image", 40, "cpu")
    data = gpu_feed.write_image_data(70, str(tmp_path / "again"), 48, 40)
    batch = next(iter(numpy_reader.iter_batches(
        data.jpeg_files, schema_file.load_schema(data.jpeg_schema), batch_size=5)))
    images = decoder(batch)["image"]
    assert images.shape == (5, 40, 40, 3) and images.dtype == torch.uint8


def test_the_raw_twins_hold_the_jpegs_images_centre_cropped(tmp_path):
    """Row for row, the raw-pixel records are the JPEG records' images (before JPEG's loss)
    cut to the crop at the centre, with the same labels; and they are tagged as raw pixels."""
    import io

    from PIL import Image

    from bench import gpu_feed
    from shard_readers import images
    from tfrecord_shards.codec import schema_file

    data = gpu_feed.write_image_data(40, str(tmp_path), size=48, crop=32, processes=2)
    jpeg_schema = schema_file.load_schema(data.jpeg_schema)
    raw_schema = schema_file.load_schema(data.raw_schema)
    assert images.raw_shape(next(f for f in raw_schema.feature if f.name == "image")) == \
        (32, 32, 3)
    (jpegs,) = numpy_reader.iter_batches(data.jpeg_files, jpeg_schema, batch_size=40)
    (raws,) = numpy_reader.iter_batches(data.raw_files, raw_schema, batch_size=40)
    assert jpegs["label"].tolist() == raws["label"].tolist()
    assert len(set(jpegs["label"].tolist())) > 20  # labels drawn over 1000 classes
    pixels = raws["image"].astype(np.int16)
    assert raws["image"].shape == (40, 32, 32, 3) and raws["image"].dtype == np.uint8
    centres = np.stack([np.asarray(Image.open(io.BytesIO(encoded)))[8:40, 8:40]
                        for encoded in jpegs["image"]]).astype(np.int16)
    errors = np.abs(centres[:, None] - pixels[None, :]).mean(axis=(2, 3, 4))
    # Each JPEG is within JPEG's loss (quality 90, chroma subsampled, on noise) of its own
    # raw twin, and far from every other image.
    assert (np.diag(errors) < 10).all()
    assert (errors[~np.eye(40, dtype=bool)] > 25).all()
    assert data.jpeg_bytes == sum(len(encoded) for encoded in jpegs["image"])
    again = gpu_feed.write_image_data(40, str(tmp_path), size=48, crop=32)
    assert again == data  # reused by its stamp


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the gpu decode runs")
def test_the_gpu_machine_script_saves_each_run_and_a_failed_one_fails_alone(tmp_path):
    """`bench/gpu_machine.sh run`, scaled down, on this CPU (whose venv holds every module,
    so nothing is installed): the machine described, one JSON result per run with its table
    shown; the GPU decode, which cannot run here, fails on its own and the status says so."""
    import json
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": sys.executable, "SCALE": "400", "MODEL": "small-conv",
           "DECODES": "gpu raw", "MLPS": "128-64", "IMAGE_SIZE": "64", "CROP": "56"}
    result = subprocess.run(["bash", "bench/gpu_machine.sh", "run", str(out)], cwd=root,
                            env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 1, result.stderr[-3000:]
    assert sorted(os.listdir(out)) == ["machine.txt", "mlp-128-64.json", "small-conv-raw.json"]
    assert f"cores: {os.cpu_count()}" in (out / "machine.txt").read_text()
    reports = {name: json.loads((out / f"{name}.json").read_text())
               for name in ("mlp-128-64", "small-conv-raw")}
    assert {report["device"] for report in reports.values()} == {"cpu"}
    assert reports["mlp-128-64"]["paths"]["end to end"]["rows"] == 4_000_000 // 400
    assert reports["small-conv-raw"]["paths"]["end to end (raw)"]["rows"] == 20_000 // 400
    assert (reports["small-conv-raw"]["image_size"], reports["small-conv-raw"]["crop"]) == (64, 56)
    assert result.stdout.count("device: cpu;") == 2
    assert "== small-conv-gpu failed" in result.stderr
    assert "--decode gpu decodes on a CUDA device" in result.stderr
