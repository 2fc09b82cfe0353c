"""`tfrp bench gpu-feed`: does our TensorFlow-free reader keep an accelerator busy?

On taxi-like rows (`bench.data`, fixed seed), every numeric feature dense and packed
PACKED_ROWS rows to a block in NUM_FILES plain files, written with no TensorFlow, a tabular
MLP (`--hidden`, e.g. 128,64 or 1024,1024,1024) trained with Adam on MSE to `tips`:

  model alone   the training step on synthetic tensors already on the device: the rate the
                device allows, with no input at all
  reader alone  `numpy_reader.TorchDataset` in a `DataLoader` (batch_size=None, `--workers`
                processes, pinned memory on CUDA), one epoch, nothing done with the batches
  end to end    the same loader through `device_feed.prefetch_to_device` into the step; the
                time spent waiting for the next batch, as a share of the epoch's wall time

Each loader's first epoch (workers starting, page cache filling) is not timed; the second
is. On CUDA the step runs under bf16 autocast with `cudnn.benchmark` on, and the clock stops
after a device synchronise. The device it ran on is part of the result; on a CPU the figures
say only that the path works. Everything runs in this process: imports only torch, numpy,
pyarrow and our TensorFlow-free modules.
"""
from __future__ import annotations

import os
import time
from typing import Callable, Sequence

from bench.display import RATE, Table

LABEL = "tips"
NUM_FILES = 8
PACKED_ROWS = 1024


def write_data(rows: int, folder: str) -> tuple[list[str], str, list[str]]:
    """(files, schema path, feature names): the packed shards, reused when the stamp says
    the same rows were written."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from tensorflow_metadata.proto.v0 import schema_pb2

    from bench import data
    from components import packing, tfrecord_io
    from components.codec import parser, schema_file
    from components.packing.write import pack_batch

    os.makedirs(folder, exist_ok=True)
    files = [os.path.join(folder, f"packed-{i:02d}.tfrecord") for i in range(NUM_FILES)]
    schema_path = os.path.join(folder, "schema.pbtxt")
    stamp = os.path.join(folder, "stamp")
    version = f"{rows}:{data.SEED}:packed{PACKED_ROWS}:numeric"
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


def _model_alone(step: Callable, features: int, batch_size: int, steps: int, device) -> dict:
    import torch

    inputs = torch.randn(batch_size, features, device=device)
    labels = torch.randn(batch_size, device=device)
    for _ in range(3):  # kernels chosen, memory allocated
        step(inputs, labels)
    _synchronise(device)
    started = time.perf_counter()
    for _ in range(steps):
        step(inputs, labels)
    _synchronise(device)
    seconds = time.perf_counter() - started
    return {"rows": steps * batch_size, "seconds": seconds,
            "rows_per_second": steps * batch_size / seconds}


def _loader(files: list[str], schema_path: str, names: list[str], batch_size: int,
            workers: int, device):
    import torch

    from components import numpy_reader
    from components.codec import schema_file

    dataset = numpy_reader.TorchDataset(files, schema_file.load_schema(schema_path),
                                        batch_size=batch_size, features=names + [LABEL],
                                        seed=0)
    return dataset, torch.utils.data.DataLoader(
        dataset, batch_size=None, num_workers=workers, pin_memory=device.type == "cuda",
        persistent_workers=workers > 0, prefetch_factor=4 if workers else None)


def _timed_epochs(dataset, loader, epochs: int, consume: Callable) -> dict:
    """The last of `epochs` epochs timed (the first warms workers and the page cache)."""
    for epoch in range(epochs):
        dataset.set_epoch(epoch)
        started, result = time.perf_counter(), consume(loader)
        seconds = time.perf_counter() - started
    return {**result, "seconds": seconds, "rows_per_second": result["rows"] / seconds}


def run_benchmark(rows: int, work_root: str, batch_size: int = 8192, workers: int = 2,
                  hidden: Sequence[int] = (128, 64), device: str = "auto", epochs: int = 2,
                  log: Callable[[str], None] = print) -> dict:
    import torch

    from components import device_feed

    on = _device(device)
    torch.backends.cudnn.benchmark = True
    files, schema_path, names = write_data(rows, os.path.join(work_root, f"gpu-feed-{rows}"))
    step = _model_and_step(len(names), hidden, on)

    def to_inputs(batch):
        inputs = torch.stack([batch[name].float() for name in names], 1)
        return inputs, batch[LABEL].float()

    log(f"model alone on {_device_name(on)}")
    alone = _model_alone(step, len(names), batch_size, max(1, rows // batch_size), on)

    def read_only(loader) -> dict:
        sizes = [len(batch[LABEL]) for batch in loader]
        return {"rows": sum(sizes), "batch_sizes": sorted(set(sizes))}

    log(f"reader alone, {workers} workers")
    reader = _timed_epochs(*_loader(files, schema_path, names, batch_size, workers, on),
                           epochs, read_only)

    def train(loader) -> dict:
        seen, waited = 0, 0.0
        batches = iter(device_feed.prefetch_to_device(loader, on))
        while True:
            asked = time.perf_counter()
            batch = next(batches, None)
            waited += time.perf_counter() - asked
            if batch is None:
                break
            step(*to_inputs(batch))
            seen += len(batch[LABEL])
        _synchronise(on)
        return {"rows": seen, "waited_seconds": waited}

    log("end to end")
    end_to_end = _timed_epochs(*_loader(files, schema_path, names, batch_size, workers, on),
                               epochs, train)
    end_to_end["waiting_fraction"] = end_to_end["waited_seconds"] / end_to_end["seconds"]
    for result in (alone, reader, end_to_end):
        result["vs_model_alone"] = result["rows_per_second"] / alone["rows_per_second"]
    return {"device": _device_name(on), "torch": torch.__version__, "cores": os.cpu_count(),
            "workers": workers, "batch_size": batch_size, "hidden": list(hidden),
            "rows": rows, "features": len(names),
            "paths": {"model alone": alone, "reader alone": reader,
                      "end to end": end_to_end}}


def table(result: dict) -> Table:
    rows = {name: {**path, "waiting": f"{path['waiting_fraction']:.1%}"
                   if "waiting_fraction" in path else "-"}
            for name, path in result["paths"].items()}
    sizes = result["paths"]["reader alone"]["batch_sizes"]
    return Table(rows, [RATE, ("vs model alone", "vs_model_alone", "{:.2f}x"),
                        ("waiting for input", "waiting", "{}")],
                 summary=f"device: {result['device']}; MLP {result['hidden']} on "
                         f"{result['features']} features, batch {result['batch_size']}, "
                         f"{result['rows']:,} rows, {result['workers']} workers, "
                         f"{result['cores']} cores, torch {result['torch']}; batch sizes "
                         f"in an epoch: {sizes}")
