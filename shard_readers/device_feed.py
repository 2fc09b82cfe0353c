"""Batches onto the accelerator for PyTorch training loops, with no TensorFlow.

- `prefetch_to_device`: what tf.data's `prefetch_to_device` does for a `DataLoader` over our
  readers (`numpy_reader.TorchDataset`, `random_access.torch_dataset`): on a CUDA device the
  next batch is copied from pinned memory on a stream of its own while the current step runs.
  With `on_device` (a GPU JPEG decode, an augmentation), the copy and that work run in a
  thread of their own, `ahead` batches ahead, so that neither holds up the training loop.
- `DeviceResident`: a dataset that fits in device memory, read once and kept there, served
  each epoch in a new order shuffled on the device.

On a CPU device there is nothing to overlap: `prefetch_to_device` passes batches through
(numpy arrays made tensors without a copy), and `DeviceResident` shuffles in memory.
torch is imported inside the functions, so importing this module needs no torch.
"""
from __future__ import annotations

import queue
import threading
from typing import Callable, Iterable, Iterator, Optional

import numpy as np

from tfrecord_shards.packing.layout import LENGTHS_SUFFIX


def _map_arrays(batch, convert: Callable):
    """`batch` (a dict, list or tuple, nested) with `convert` applied to its tensors and
    numeric numpy arrays; arrays of bytes (object dtype) stay as they are."""
    # torch: 1.7 s to import, optional; the numpy reader imports this module without it
    import torch

    if isinstance(batch, dict):
        return {name: _map_arrays(value, convert) for name, value in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(_map_arrays(value, convert) for value in batch)
    if isinstance(batch, np.ndarray) and batch.dtype != object:
        return convert(torch.from_numpy(batch))
    if isinstance(batch, torch.Tensor):
        return convert(batch)
    return batch


def _to_device(batch, device):
    """`batch` with its tensors on `device`: on CUDA pinned (unless the DataLoader pinned
    them) and copied without blocking, on the caller's current stream."""
    if device.type != "cuda":
        return _map_arrays(batch, lambda tensor: tensor.to(device))
    return _map_arrays(batch, lambda tensor: (
        tensor if tensor.is_pinned() else tensor.pin_memory()).to(device, non_blocking=True))


def _used_on(batch, stream):
    """`batch`, its tensors made on a side stream and now used on `stream`: the caching
    allocator must not hand their memory out again before `stream` is done with them."""
    def record(tensor):
        tensor.record_stream(stream)
        return tensor
    return _map_arrays(batch, record)


def prefetch_to_device(batches: Iterable, device="cuda",
                       on_device: Optional[Callable] = None, ahead: int = 2) -> Iterator:
    """The batches of `batches` with their tensors (and numeric numpy arrays) on `device`,
    one batch ahead; or, with `on_device`, `on_device(batch)` of each, `ahead` batches ahead.

    On a CUDA device, batch n+1 is pinned (unless already pinned: give the DataLoader
    `pin_memory=True`, which pins in its own thread) and copied on a side stream while the
    caller's step on batch n runs on the current stream; the current stream waits for the
    copy before the batch is handed over. On any other device, batches pass through with
    numpy arrays made tensors (no copy, no thread).

    `on_device` takes the batch once its tensors are on the device (arrays of bytes stay on
    the host, as always) and returns what the caller gets: for instance the JPEG bytes
    decoded by nvJPEG (`torchvision.io.decode_jpeg(..., device=)`) and cropped. Its host
    work would otherwise stall the training loop batch by batch, so reading, copying and
    `on_device` run in a thread of their own (on the side stream on CUDA; torch releases the
    GIL inside its ops), at most `ahead` batches ahead of the caller. An error there is
    raised to the caller at the batch where it happened; a caller that stops early stops the
    thread, which finishes at most the batch it is reading."""
    # torch: 1.7 s to import, optional; the numpy reader imports this module without it
    import torch

    device = torch.device(device)
    if on_device is not None:
        yield from _ahead_in_thread(batches, device, on_device, ahead)
        return
    if device.type != "cuda":
        for batch in batches:
            yield _to_device(batch, device)
        return
    side = torch.cuda.Stream(device)
    current = torch.cuda.current_stream(device)
    iterator = iter(batches)

    def copy_next():
        for batch in iterator:
            with torch.cuda.stream(side):
                return _to_device(batch, device)
        return None

    ahead = copy_next()
    while ahead is not None:
        current.wait_stream(side)
        batch = _used_on(ahead, current)
        ahead = copy_next()
        yield batch


_END = object()


def _ahead_in_thread(batches: Iterable, device, on_device: Callable, ahead: int) -> Iterator:
    # torch: 1.7 s to import, optional; the numpy reader imports this module without it
    import torch

    if ahead < 1:
        raise ValueError(f"ahead={ahead}: at least 1 batch")
    cuda = device.type == "cuda"
    side = torch.cuda.Stream(device) if cuda else None
    ready: queue.Queue = queue.Queue(maxsize=ahead)
    stopped = threading.Event()

    def hand_over(item) -> bool:
        while not stopped.is_set():
            try:
                ready.put(item, timeout=0.05)
                return True
            except queue.Full:
                pass
        return False

    def produce() -> None:
        try:
            for batch in batches:
                if cuda:
                    with torch.cuda.device(device), torch.cuda.stream(side):
                        made = on_device(_to_device(batch, device))
                        done = torch.cuda.Event()
                        done.record(side)
                else:
                    made, done = on_device(_to_device(batch, device)), None
                if not hand_over((made, done, None)):
                    return
            hand_over((_END, None, None))
        except BaseException as error:  # handed to the caller, raised there
            hand_over((None, None, error))

    worker = threading.Thread(target=produce, name="prefetch_to_device", daemon=True)
    worker.start()
    current = torch.cuda.current_stream(device) if cuda else None
    try:
        while True:
            made, done, error = ready.get()
            if error is not None:
                raise error
            if made is _END:
                return
            if cuda:
                current.wait_event(done)
                made = _used_on(made, current)
            yield made
    finally:
        stopped.set()
        # A DataLoader's iterator is not to be shared: the thread is done with it before the
        # caller can start the next epoch.
        worker.join()


class DeviceResident:
    """A dataset that fits in device memory, kept there: `batches` (dicts of arrays, such as
    `numpy_reader.iter_batches` gives) are read once and joined column by column on `device`;
    each epoch then yields batches of `batch_size` rows cut from a permutation drawn on the
    device (seeded by `seed` and the epoch set by `set_epoch`; row order without a seed).
    Every batch is full but the last, which `drop_last` drops. Features of several values a
    row (values plus `__lengths`) and bytes features have no place here and are refused;
    raw-pixel images, which the readers give as uint8 [rows, h, w, c], are kept."""

    def __init__(self, batches: Iterable[dict], device="cuda", batch_size: int = 1024,
                 seed: Optional[int] = None, drop_last: bool = False):
        # torch: 1.7 s to import, optional; the numpy reader imports this module without it
        import torch

        parts: dict[str, list] = {}
        for batch in batches:
            for name, values in batch.items():
                if name.endswith(LENGTHS_SUFFIX):
                    raise ValueError(f"{name[:-len(LENGTHS_SUFFIX)]!r} has several values a "
                                     f"row; DeviceResident keeps one row per index "
                                     f"(pass features=[...] without it)")
                if isinstance(values, np.ndarray) and values.dtype == object:
                    raise ValueError(f"{name!r} is bytes, which a device cannot hold "
                                     f"(pass features=[...] without it)")
                parts.setdefault(name, []).append(torch.as_tensor(values))
        self.device = torch.device(device)
        self.columns = {name: torch.cat(values).to(self.device)
                        for name, values in parts.items()}
        counts = {len(column) for column in self.columns.values()}
        if len(counts) > 1:
            raise ValueError(f"columns of different lengths: {sorted(counts)}")
        self.rows = counts.pop() if counts else 0
        self.batch_size, self.seed, self.drop_last, self.epoch = \
            batch_size, seed, drop_last, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        full, rest = divmod(self.rows, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def order(self):
        """This epoch's row order, on the device."""
        # torch: 1.7 s to import, optional; the numpy reader imports this module without it
        import torch

        if self.seed is None:
            return torch.arange(self.rows, device=self.device)
        generator = torch.Generator(device=self.device)
        generator.manual_seed(self.seed * 1_000_003 + self.epoch)
        return torch.randperm(self.rows, generator=generator, device=self.device)

    def __iter__(self) -> Iterator[dict]:
        order = self.order()
        for number in range(len(self)):
            rows = order[number * self.batch_size:(number + 1) * self.batch_size]
            yield {name: column.index_select(0, rows) for name, column in self.columns.items()}
