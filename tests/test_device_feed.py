"""The device stage (components/device_feed.py) on this machine's CPU: `prefetch_to_device`
hands over every batch unchanged and in order, `DeviceResident` serves every row once an
epoch in a seeded order shuffled where the data lives. The CUDA stream path runs on a GPU
only (`tfrp bench gpu-feed` there)."""
from __future__ import annotations

import glob
import os

import numpy as np
import pytest

from components import device_feed, numpy_reader

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


def test_a_resident_dataset_refuses_features_it_cannot_index_by_row():
    with pytest.raises(ValueError, match="'tags' has several values a row"):
        device_feed.DeviceResident([{"tags": np.arange(3), "tags__lengths": np.array([3])}],
                                   "cpu")
    with pytest.raises(ValueError, match="'name' is bytes"):
        device_feed.DeviceResident([{"name": np.array([b"x"], dtype=object)}], "cpu")


def test_bench_gpu_feed_runs_here_without_tensorflow_and_names_its_device(tmp_path):
    """`tfrp bench gpu-feed` with small settings, TensorFlow blocked in its process as on
    a machine without it: the three rates, the waiting share, the device it ran on, and an
    epoch of batches of one size but the last."""
    import json
    import subprocess
    import sys

    code = ("import sys; sys.modules['tensorflow'] = None; sys.argv[0] = 'tfrp'\n"
            "from pipeline.cli import main; main()")
    args = ["bench", "gpu-feed", "--rows", "20000", "--batch-size", "2048", "--workers", "2",
            "--hidden", "32,16", "--work-dir", str(tmp_path)]
    result = subprocess.run([sys.executable, "-c", code, *args, "--json"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["device"] == ("cpu" if not torch.cuda.is_available()
                                else torch.cuda.get_device_name())
    paths = report["paths"]
    assert set(paths) == {"model alone", "reader alone", "end to end"}
    assert all(path["rows_per_second"] > 0 for path in paths.values())
    assert paths["reader alone"]["rows"] == paths["end to end"]["rows"] == 20000
    assert paths["reader alone"]["batch_sizes"] == [20000 % 2048, 2048]
    assert 0 <= paths["end to end"]["waiting_fraction"] < 1
    table = subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                           text=True)
    assert table.returncode == 0, table.stderr[-3000:]
    assert "waiting for input" in table.stdout
    assert f"device: {report['device']};" in table.stdout
