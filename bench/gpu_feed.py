"""`python -m bench gpu-feed`: does our TensorFlow-free reader keep an accelerator busy?

Tabular (`--workload tabular`, the default): on taxi-like rows (`testsupport.data`, fixed seed),
every numeric feature dense and packed PACKED_ROWS rows to a block in NUM_FILES plain files,
written with no TensorFlow, a tabular MLP (`--hidden`, e.g. 128,64 or 1024,1024,1024) trained
with Adam on MSE to `tips`:

  model alone   the training step on synthetic tensors already on the device: the rate the
                device allows, with no input at all
  reader alone, a tensor per feature
                `numpy_reader.TorchDataset` in a `DataLoader` (batch_size=None, `--workers`
                processes, pinned memory on CUDA), one epoch, nothing done with the batches:
                each feature its own array, as the reader gives them
  reader alone  the same with the features stacked into one float32 matrix in the workers
                (`numpy_reader.StackFeatures`): one array a batch through the DataLoader's
                shared memory instead of one a feature
  end to end    the stacked loader through `device_feed.prefetch_to_device` into the step;
                the time spent waiting for the next batch, as a share of the epoch's wall
                time, and apart the share of it spent on the epoch's first `--workers`
                batches (each worker's first: paid once an epoch, so a short epoch shows
                more of it than a long one)
  device resident
                the table read once into device memory (`device_feed.DeviceResident`,
                stacked as above; its load timed apart), then the step on batches cut from
                a seeded permutation on the device: no loader at all, for a table that fits

Each loader's first epoch (workers starting, page cache filling) is not timed; the second
is. On CUDA the step runs under bf16 autocast with `cudnn.benchmark` on, and the clock stops
after a device synchronise. The device it ran on is part of the result; on a CPU the model
figures say only that the path works, while the two reader rows measure the host's work.
Everything runs in this process: imports only torch, numpy, pyarrow and our TensorFlow-free
modules.

Images (`--workload images`): `--images` synthetic photographs (smooth random colour fields
plus noise, fixed seed, `--image-size` square, JPEG quality 90), one Example each with the
JPEG bytes in `image` and an int `label`, in IMAGE_FILES plain files; beside them their
raw-pixel twins, centre-cropped to `--crop` and tagged `tfrp.raw_pixels=<c>x<c>x3` as
Transform's raw storage is. Written once by processes on every core, with our codec's encoder
and framing (no TensorFlow), and reused by stamp. The model (`--model`: `small-conv`, four
conv/BN/ReLU layers defined here, or torchvision's `resnet50`) trains with SGD on
cross-entropy over 1000 classes on uint8 [batch, crop, crop, 3] images normalised on the
device, channels last, images/s reported:

  model alone   the step on synthetic uint8 images already on the device
  reader alone  the DataLoader (`--workers`, pinned memory on CUDA) and the decode, for each
                `--decode`:
                  cpu  PIL decodes each JPEG in the worker that read it
                       (`TorchDataset(transform=jpeg_crops.JpegCropsOnHost)`), a random crop x crop
                       window, flipped left-right at random;
                  gpu  the workers hand on the JPEG bytes, and a thread of the training
                       process decodes each batch on the device with
                       `torchvision.io.decode_jpeg` (one batched call, nvJPEG) and cuts the
                       same random windows and flips in one gather, two batches ahead of the
                       step (`prefetch_to_device(on_device=...)`, on a side stream);
                  raw  the raw twins, which the reader gives as uint8 [rows, crop, crop, 3]
                       (a view of the decoded records), and the DataLoader pins; no decode,
                       no crop
  end to end    the same through `device_feed.prefetch_to_device` into the step; the time
                waiting for input is the time the step waits for the stage's next batch
                (for `gpu`, the decode's device time shows in the rate, as it shares the GPU)

As for tabular: the second epoch of each loader is timed, the device is named in the result,
and nothing imports TensorFlow. The issue's target on a GPU: end to end at least 95% of the
model alone, waiting at most 5%.
"""
from __future__ import annotations

import dataclasses
import os
import time
from typing import TYPE_CHECKING, Callable, Iterable, Optional, Sequence

from bench.display import RATE, Table

if TYPE_CHECKING:  # annotations only; torch is imported when the bench runs
    import numpy as np
    import torch

LABEL = "tips"
INPUTS = "features"  # the numeric features stacked into one matrix in the workers
NUM_FILES = 8
PACKED_ROWS = 1024


def write_data(rows: int, folder: str) -> tuple[list[str], str, list[str]]:
    """(files, schema path, feature names): the packed shards, reused when the stamp says
    the same rows were written."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from tensorflow_metadata.proto.v0 import schema_pb2

    from testsupport import data
    from tfrecord_shards import packing, record_index, tfrecord_io
    from tfrecord_shards.codec import parser, schema_file
    from tfrecord_shards.packing.write import pack_batch

    os.makedirs(folder, exist_ok=True)
    files = [os.path.join(folder, f"packed-{i:02d}.tfrecord") for i in range(NUM_FILES)]
    schema_path = os.path.join(folder, "schema.pbtxt")
    stamp = os.path.join(folder, "stamp")
    version = f"{rows}:{data.SEED}:packed{PACKED_ROWS}:numeric:indexed"
    table = None
    if not (os.path.exists(stamp) and open(stamp).read() == version):
        table = data.taxi_like_table(rows)
    taxi_schema = schema_file.load_schema(os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "schemas", "taxi",
        "schema.pbtxt"))
    numeric = [f for f in taxi_schema.feature if f.type != schema_pb2.BYTES]
    names = [f.name for f in numeric if f.name != LABEL]
    if table is None:
        return files, schema_path, names
    schema = schema_pb2.Schema()
    schema.feature.extend(numeric)
    for feature in schema.feature:  # dense: every row has its one value
        feature.presence.min_fraction = 1.0
        feature.presence.min_count = 1
        feature.ClearField("shape")
        feature.shape.dim.add().size = 1
    defaults = parser.feature_by_name(schema)
    filled = pa.table({f.name: pc.fill_null(table[f.name], parser.default_value(defaults[
        f.name])) for f in schema.feature})
    packed = packing.annotate(schema, PACKED_ROWS)
    schema_file.write_schema(packed, schema_path)
    per_file = -(-rows // NUM_FILES)
    for i, path in enumerate(files):
        blocks = pack_batch(filled.slice(i * per_file, per_file),
                            packing.PackedLayout.from_schema(packed))
        with open(path, "wb") as f:
            f.write(tfrecord_io.frame_records(blocks)[0].tobytes())
        # As `tfrp index` writes it: a reader whose share starts inside the file seeks there.
        record_index.RecordIndex.build(path).save()
    with open(stamp, "w") as f:
        f.write(version)
    return files, schema_path, names


def _device(requested: str):
    import torch

    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(requested)


def _device_name(device) -> str:
    import torch

    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def _synchronise(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _model_and_step(features: int, hidden: Sequence[int], device) -> Callable:
    """The training step: (inputs [rows, features], labels [rows]) -> None."""
    import torch

    layers, width = [torch.nn.BatchNorm1d(features)], features
    for size in hidden:
        layers += [torch.nn.Linear(width, size), torch.nn.ReLU()]
        width = size
    model = torch.nn.Sequential(*layers, torch.nn.Linear(width, 1)).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    autocast = device.type == "cuda"

    def step(inputs, labels) -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            loss = torch.nn.functional.mse_loss(model(inputs).squeeze(1), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return step


def _model_alone(run_step: Callable[[], None], batch_size: int, steps: int, device) -> dict:
    """`steps` runs of `run_step` (a training step on one batch of `batch_size` rows already
    on the device), timed after three untimed ones."""
    for _ in range(3):  # kernels chosen, memory allocated
        run_step()
    _synchronise(device)
    started = time.perf_counter()
    for _ in range(steps):
        run_step()
    _synchronise(device)
    seconds = time.perf_counter() - started
    return {"rows": steps * batch_size, "seconds": seconds,
            "rows_per_second": steps * batch_size / seconds}


def _loader(files: list[str], schema_path: str, features: list[str], batch_size: int,
            workers: int, device, transform: Optional[Callable] = None, prefetch: int = 4):
    """(dataset, DataLoader) over `files`: `prefetch` batches ahead in each worker, pinned
    on CUDA."""
    import torch

    from shard_readers import numpy_reader
    from tfrecord_shards.codec import schema_file

    dataset = numpy_reader.TorchDataset(files, schema_file.load_schema(schema_path),
                                        batch_size=batch_size, features=features, seed=0,
                                        transform=transform)
    return dataset, torch.utils.data.DataLoader(
        dataset, batch_size=None, num_workers=workers, pin_memory=device.type == "cuda",
        persistent_workers=workers > 0, prefetch_factor=prefetch if workers else None)


def _timed_epochs(dataset, loader, epochs: int, consume: Callable) -> dict:
    """The last of `epochs` epochs timed (the first warms workers and the page cache)."""
    for epoch in range(epochs):
        dataset.set_epoch(epoch)
        started, result = time.perf_counter(), consume(loader)
        seconds = time.perf_counter() - started
    return {**result, "seconds": seconds, "rows_per_second": result["rows"] / seconds}


def _trained_epoch(batches: Iterable, train_on: Callable, label: str, workers: int,
                   device) -> dict:
    """`train_on` each of `batches`, with the time spent waiting for them: in all, and in the
    first `workers` batches apart, the epoch's start, while each worker reads its first
    batch (a wait there is paid once an epoch, however long the epoch)."""
    rows, waits, batches = 0, [], iter(batches)
    while True:
        asked = time.perf_counter()
        batch = next(batches, None)
        waits.append(time.perf_counter() - asked)
        if batch is None:
            break
        train_on(batch)
        rows += len(batch[label])
    _synchronise(device)
    return {"rows": rows, "waited_seconds": sum(waits),
            "waited_at_start_seconds": sum(waits[:max(1, workers)])}


def _waiting_shares(end_to_end: dict) -> dict:
    """`end_to_end` with its waits as shares of its epoch's wall time."""
    return {**end_to_end,
            "waiting_fraction": end_to_end["waited_seconds"] / end_to_end["seconds"],
            "waiting_at_start_fraction":
                end_to_end["waited_at_start_seconds"] / end_to_end["seconds"]}


def _waiting(path: dict) -> str:
    """The waiting column: the share of the epoch, and of it the share at the epoch's start."""
    if "waiting_fraction" not in path:
        return "-"
    if "waiting_at_start_fraction" not in path:  # a result saved before it was measured
        return f"{path['waiting_fraction']:.1%}"
    return (f"{path['waiting_fraction']:.1%} "
            f"({path['waiting_at_start_fraction']:.1%} at start)")


def run_benchmark(rows: int, work_root: str, batch_size: int = 8192, workers: int = 2,
                  hidden: Sequence[int] = (128, 64), device: str = "auto", epochs: int = 2,
                  log: Callable[[str], None] = print) -> dict:
    import torch

    from shard_readers import device_feed, numpy_reader
    from tfrecord_shards.codec import schema_file

    on = _device(device)
    torch.backends.cudnn.benchmark = True
    files, schema_path, names = write_data(rows, os.path.join(work_root, f"gpu-feed-{rows}"))
    step = _model_and_step(len(names), hidden, on)
    stacked = numpy_reader.StackFeatures(names, into=INPUTS)

    log(f"model alone on {_device_name(on)}")
    synthetic = torch.randn(batch_size, len(names), device=on)
    targets = torch.randn(batch_size, device=on)
    alone = _model_alone(lambda: step(synthetic, targets), batch_size,
                         max(1, rows // batch_size), on)

    def read_only(loader) -> dict:
        sizes = [len(batch[LABEL]) for batch in loader]
        return {"rows": sum(sizes), "batch_sizes": sorted(set(sizes))}

    log(f"reader alone, a tensor per feature, {workers} workers")
    per_feature = _timed_epochs(*_loader(files, schema_path, names + [LABEL], batch_size,
                                         workers, on), epochs, read_only)
    log(f"reader alone, {workers} workers")
    reader = _timed_epochs(*_loader(files, schema_path, names + [LABEL], batch_size, workers,
                                    on, stacked), epochs, read_only)

    def train_on(batch) -> None:
        step(batch[INPUTS], batch[LABEL].float())

    def train(loader) -> dict:
        return _trained_epoch(device_feed.prefetch_to_device(loader, on), train_on, LABEL,
                              workers, on)

    log("end to end")
    end_to_end = _waiting_shares(_timed_epochs(*_loader(
        files, schema_path, names + [LABEL], batch_size, workers, on, stacked), epochs, train))

    log("device resident")
    loaded = time.perf_counter()
    resident = device_feed.DeviceResident(
        (stacked(batch) for batch in numpy_reader.iter_batches(
            files, schema_file.load_schema(schema_path), batch_size=65536,
            features=names + [LABEL])), on, batch_size=batch_size, seed=0)
    _synchronise(on)
    load_seconds = time.perf_counter() - loaded
    in_memory = _waiting_shares(_timed_epochs(
        resident, resident, epochs, lambda batches: _trained_epoch(batches, train_on, LABEL, 1,
                                                                   on)))
    in_memory["load_seconds"] = load_seconds
    for result in (alone, per_feature, reader, end_to_end, in_memory):
        result["vs_model_alone"] = result["rows_per_second"] / alone["rows_per_second"]
    return {"workload": "tabular", "device": _device_name(on), "torch": torch.__version__,
            "cores": os.cpu_count(), "workers": workers, "batch_size": batch_size,
            "hidden": list(hidden),
            "rows": rows, "features": len(names),
            "paths": {"model alone": alone, "reader alone, a tensor per feature": per_feature,
                      "reader alone": reader, "end to end": end_to_end,
                      "device resident": in_memory}}


def table(result: dict) -> Table:
    if result.get("workload") == "images":
        return image_table(result)
    rows = {name: {**path, "waiting": _waiting(path)} for name, path in result["paths"].items()}
    sizes = result["paths"]["reader alone"]["batch_sizes"]
    resident = result["paths"].get("device resident")
    loaded = f"; device resident: loaded in {resident['load_seconds']:.2f} s" \
        if resident else ""
    return Table(rows, [RATE, ("vs model alone", "vs_model_alone", "{:.2f}x"),
                        ("waiting for input", "waiting", "{}")],
                 summary=f"device: {result['device']}; MLP {result['hidden']} on "
                         f"{result['features']} features, batch {result['batch_size']}, "
                         f"{result['rows']:,} rows, {result['workers']} workers, "
                         f"{result['cores']} cores, torch {result['torch']}; batch sizes "
                         f"in an epoch: {sizes}" + loaded)


# ---------------------------------------------------------------------------------------------
# The image workload
# ---------------------------------------------------------------------------------------------

IMAGE_FEATURE = "image"
IMAGE_LABEL = "label"
IMAGE_FILES = 16
IMAGE_SEED = 20261126
JPEG_QUALITY = 90
CLASSES = 1000
MODELS = ("small-conv", "resnet50")
DECODES = ("cpu", "gpu", "raw")
DECODE_WORDS = {"cpu": "PIL in the workers", "gpu": "decode_jpeg on the device, ahead",
                "raw": "raw pixels, no decode"}
# ImageNet's channel means and deviations, in pixel units: the model's first step on the device.
PIXEL_MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
PIXEL_STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)
# Rows a writing task encodes and frames at a time: a raw-pixel row is size*size*3 bytes.
_WRITE_ROWS = 256


class Unavailable(RuntimeError):
    """What the chosen options need and this machine lacks (torchvision, a CUDA device)."""


@dataclasses.dataclass(frozen=True)
class ImageData:
    """The image records written for the bench: the same images as JPEG bytes (`jpeg_files`,
    size x size) and as raw pixels centre-cropped to crop x crop (`raw_files`), each with an
    int label, one image an Example."""
    jpeg_files: list[str]
    jpeg_schema: str
    raw_files: list[str]
    raw_schema: str
    images: int
    jpeg_bytes: int


def synthetic_image(rng, size: int, noise) -> "np.ndarray":
    """A size x size RGB uint8 image: a smooth random colour field (a 4x4 grid of colours,
    bicubically upsampled) plus a window of `noise` (int16, at least 2*size square) at a
    random place, so that JPEG sizes come out near a photograph's rather than a flat
    image's few hundred bytes."""
    import numpy as np
    from PIL import Image

    coarse = Image.fromarray(rng.integers(0, 256, (4, 4, 3), dtype=np.uint8))
    smooth = np.asarray(coarse.resize((size, size), Image.BICUBIC), np.int16)
    top, left = rng.integers(0, noise.shape[0] - size, 2)
    return np.clip(smooth + noise[top:top + size, left:left + size], 0, 255).astype(np.uint8)


def _write_image_shard(task: tuple) -> int:
    """Writes one JPEG shard and its raw-pixel twin; (number, count, size, crop, jpeg path,
    raw path) -> JPEG bytes written. Seeded by the shard's number, so that the images do not
    depend on how shards are spread over processes."""
    import io

    import numpy as np
    import pyarrow as pa
    from PIL import Image

    from tfrecord_shards import fileio, record_index, tfrecord_io
    from tfrecord_shards.codec import serializer

    number, count, size, crop, jpeg_path, raw_path = task
    rng = np.random.default_rng([IMAGE_SEED, number])
    noise = np.round(rng.normal(0, 8, (2 * size, 2 * size, 3))).astype(np.int16)
    columns = {IMAGE_FEATURE: (serializer.BYTES, False), IMAGE_LABEL: (serializer.INT, False)}
    margin = (size - crop) // 2
    jpeg_bytes = 0
    with fileio.open_file(jpeg_path, "wb") as jpeg_out, \
            fileio.open_file(raw_path, "wb") as raw_out:
        for first in range(0, count, _WRITE_ROWS):
            rows = min(_WRITE_ROWS, count - first)
            labels = pa.array(rng.integers(0, CLASSES, rows), pa.int64())
            jpegs, raws = [], []
            for _ in range(rows):
                pixels = synthetic_image(rng, size, noise)
                encoded = io.BytesIO()
                Image.fromarray(pixels).save(encoded, "JPEG", quality=JPEG_QUALITY)
                jpegs.append(encoded.getvalue())
                raws.append(pixels[margin:margin + crop, margin:margin + crop].tobytes())
            jpeg_bytes += sum(len(data) for data in jpegs)
            for out, images in ((jpeg_out, jpegs), (raw_out, raws)):
                batch = pa.RecordBatch.from_arrays([pa.array(images, pa.binary()), labels],
                                                   [IMAGE_FEATURE, IMAGE_LABEL])
                records = serializer.encode_examples_array(
                    serializer.to_example_batch(batch, columns))
                out.write(tfrecord_io.frame_records(records)[0].tobytes())
    for path in (jpeg_path, raw_path):
        record_index.RecordIndex.build(path).save()
    return jpeg_bytes


def write_image_data(count: int, folder: str, size: int = 256, crop: int = 224,
                     processes: Optional[int] = None) -> ImageData:
    """`count` synthetic images (`synthetic_image`, fixed seed) written as IMAGE_FILES JPEG
    shards (quality JPEG_QUALITY, size x size) and their raw-pixel twins (crop x crop,
    tagged `tfrp.raw_pixels=` in their schema as Transform's raw storage is), with a uniform
    label in [0, CLASSES); reused when the stamp says the same images were written. Shards
    are written by `processes` processes (one a core by default)."""
    import concurrent.futures

    from shard_readers import images
    from tfrecord_shards import fileio
    from tfrecord_shards.codec import schema_file, serializer

    fileio.makedirs(folder)
    names = [f"{i:02d}.tfrecord" for i in range(IMAGE_FILES)]
    jpeg_files = [fileio.join(folder, "jpeg-" + name) for name in names]
    raw_files = [fileio.join(folder, "raw-" + name) for name in names]
    jpeg_schema = fileio.join(folder, "jpeg-schema.pbtxt")
    raw_schema = fileio.join(folder, "raw-schema.pbtxt")
    stamp = fileio.join(folder, "stamp")
    version = f"{count}:{IMAGE_SEED}:{size}:{crop}:q{JPEG_QUALITY}:{IMAGE_FILES}:indexed"
    written = fileio.read_text(stamp).split("\n") if fileio.exists(stamp) else []
    if written[:1] == [version]:
        return ImageData(jpeg_files, jpeg_schema, raw_files, raw_schema, count,
                         int(written[1]))
    columns = {IMAGE_FEATURE: (serializer.BYTES, False), IMAGE_LABEL: (serializer.INT, False)}
    schema = serializer.schema_from_profile(columns, count, {name: count for name in columns},
                                            {})
    schema_file.write_schema(schema, jpeg_schema)
    schema_file.write_schema(images.mark_raw(schema, [IMAGE_FEATURE],
                                             images.ImageSpec(crop, crop, 3)), raw_schema)
    counts = [count // IMAGE_FILES + (i < count % IMAGE_FILES) for i in range(IMAGE_FILES)]
    tasks = [(i, counts[i], size, crop, jpeg_files[i], raw_files[i])
             for i in range(IMAGE_FILES)]
    with concurrent.futures.ProcessPoolExecutor(
            min(IMAGE_FILES, processes or os.cpu_count() or 1)) as pool:
        jpeg_bytes = sum(pool.map(_write_image_shard, tasks))
    fileio.write_text(stamp, f"{version}\n{jpeg_bytes}")
    return ImageData(jpeg_files, jpeg_schema, raw_files, raw_schema, count, jpeg_bytes)


def _device_decode_here(device) -> None:
    """Nothing, or Unavailable saying why `--decode gpu` cannot run here."""
    from shard_readers import jpeg_crops

    try:
        jpeg_crops.device_jpeg_decoder(device)
    except ValueError:
        raise Unavailable(f"--decode gpu decodes on a CUDA device; this run's device is "
                          f"{device}") from None
    except (ImportError, RuntimeError) as error:  # RuntimeError: a build for another torch
        raise Unavailable(f"--decode gpu needs torchvision.io.decode_jpeg ({error})") from None


def _image_model(model_name: str):
    """The model, on the CPU, or Unavailable saying why it cannot be made here."""
    import torch

    if model_name == "resnet50":
        try:
            from torchvision.models import resnet50
        except (ImportError, RuntimeError) as error:  # RuntimeError: a build for another torch
            raise Unavailable(f"--model resnet50 needs torchvision ({error}); --model "
                              f"small-conv needs none") from None
        return resnet50(num_classes=CLASSES)
    if model_name == "small-conv":
        layers, width = [], 3
        for channels in (32, 64, 128, 256):
            layers += [torch.nn.Conv2d(width, channels, 3, stride=2, padding=1, bias=False),
                       torch.nn.BatchNorm2d(channels), torch.nn.ReLU(inplace=True)]
            width = channels
        return torch.nn.Sequential(*layers, torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                                   torch.nn.Linear(width, CLASSES))
    raise ValueError(f"model {model_name!r}: one of {MODELS}")


def _image_model_and_step(model: "torch.nn.Module", device) -> Callable:
    """The training step: (uint8 images [rows, h, w, 3] on the device, int64 labels [rows])
    -> None. Pixels are normalised on the device, as the model's first step; the model runs
    channels last (NHWC images permuted to NCHW are channels last already, no copy), under
    bf16 autocast on CUDA, with SGD on cross-entropy over CLASSES classes."""
    import torch

    model = model.to(device, memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    mean = torch.tensor(PIXEL_MEAN, device=device).view(1, 3, 1, 1)
    std = torch.tensor(PIXEL_STD, device=device).view(1, 3, 1, 1)
    autocast = device.type == "cuda"

    def step(images, labels) -> None:
        inputs = (images.permute(0, 3, 1, 2).float() - mean) / std
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            loss = torch.nn.functional.cross_entropy(model(inputs), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return step


def run_image_benchmark(images: int, work_root: str, batch_size: int = 256, workers: int = 2,
                        model: str = "small-conv", decodes: Sequence[str] = ("cpu",),
                        image_size: int = 256, crop: int = 224, device: str = "auto",
                        epochs: int = 2, log: Callable[[str], None] = print) -> dict:
    """The image workload: `model` trained on `crop` x `crop` images, alone on synthetic
    device images, then for each of `decodes` the reader alone and end to end."""
    import torch

    from shard_readers import device_feed, jpeg_crops

    unknown = sorted(set(decodes) - set(DECODES))
    if unknown:
        raise ValueError(f"decode {unknown}: each one of {DECODES}")
    if crop > image_size:
        raise ValueError(f"a {crop} crop of {image_size}x{image_size} images")
    on = _device(device)
    # What this machine lacks is said before any image is written; the images are written
    # (by forked processes) before the device is first used.
    network = _image_model(model)
    if "gpu" in decodes:
        _device_decode_here(on)
    data = write_image_data(images, os.path.join(
        work_root, f"gpu-feed-images-{images}-{image_size}-{crop}"), image_size, crop)
    torch.backends.cudnn.benchmark = True
    step = _image_model_and_step(network, on)
    device_crops = jpeg_crops.JpegCropsOnDevice(IMAGE_FEATURE, crop, on) \
        if "gpu" in decodes else None

    log(f"model alone on {_device_name(on)}: {model}")
    synthetic = torch.randint(0, 256, (batch_size, crop, crop, 3), dtype=torch.uint8,
                              device=on)
    labels = torch.randint(0, CLASSES, (batch_size,), device=on)
    alone = _model_alone(lambda: step(synthetic, labels), batch_size,
                         max(1, images // batch_size), on)
    paths = {"model alone": alone}
    for decode in decodes:
        files, schema_path = (data.raw_files, data.raw_schema) if decode == "raw" else \
            (data.jpeg_files, data.jpeg_schema)
        transform = jpeg_crops.JpegCropsOnHost(IMAGE_FEATURE, crop) if decode == "cpu" \
            else None

        def staged(loader):
            """The loader's batches on the device; a GPU decode runs ahead in its thread."""
            return device_feed.prefetch_to_device(
                loader, on, on_device=device_crops if decode == "gpu" else None)

        def read_only(loader) -> dict:
            # The GPU decode is the reader's work, even on the device.
            sizes = [len(batch[IMAGE_LABEL])
                     for batch in (staged(loader) if decode == "gpu" else loader)]
            _synchronise(on)
            return {"rows": sum(sizes), "batch_sizes": sorted(set(sizes))}

        def train(loader) -> dict:
            return _trained_epoch(staged(loader),
                                  lambda batch: step(batch[IMAGE_FEATURE], batch[IMAGE_LABEL]),
                                  IMAGE_LABEL, workers, on)

        features = [IMAGE_FEATURE, IMAGE_LABEL]
        log(f"reader alone, {decode} decode ({DECODE_WORDS[decode]}), {workers} workers")
        reader = _timed_epochs(*_loader(files, schema_path, features, batch_size, workers, on,
                                        transform, prefetch=2), epochs, read_only)
        log(f"end to end, {decode} decode")
        end_to_end = _waiting_shares(_timed_epochs(*_loader(
            files, schema_path, features, batch_size, workers, on, transform, prefetch=2),
            epochs, train))
        paths[f"reader alone ({decode})"] = reader
        paths[f"end to end ({decode})"] = end_to_end
    for result in paths.values():
        result["vs_model_alone"] = result["rows_per_second"] / alone["rows_per_second"]
    return {"workload": "images", "device": _device_name(on), "torch": torch.__version__,
            "cores": os.cpu_count(), "workers": workers, "batch_size": batch_size,
            "model": model, "images": images, "image_size": image_size, "crop": crop,
            "jpeg_bytes_per_image": data.jpeg_bytes / max(1, images),
            "decodes": list(decodes), "paths": paths}


def image_table(result: dict) -> Table:
    rows = {name: {**path, "waiting": _waiting(path)} for name, path in result["paths"].items()}
    sizes = {decode: result["paths"][f"reader alone ({decode})"]["batch_sizes"]
             for decode in result["decodes"]}
    words = "; ".join(f"{decode}: {DECODE_WORDS[decode]}" for decode in result["decodes"])
    return Table(rows, [("images/s", "rows_per_second", "{:,.0f}"),
                        ("vs model alone", "vs_model_alone", "{:.2f}x"),
                        ("waiting for input", "waiting", "{}")],
                 summary=f"device: {result['device']}; {result['model']} on "
                         f"{result['crop']}x{result['crop']} crops of "
                         f"{result['image_size']}x{result['image_size']} JPEGs "
                         f"({result['jpeg_bytes_per_image']:,.0f} bytes each), batch "
                         f"{result['batch_size']}, {result['images']:,} images, "
                         f"{result['workers']} workers, {result['cores']} cores, torch "
                         f"{result['torch']}; {words}; batch sizes in an epoch: {sizes}")
