"""JPEG image records to uint8 training crops for PyTorch, with no TensorFlow, on either side
of the copy to the accelerator:

- `JpegCropsOnHost`: a `numpy_reader.TorchDataset` transform; PIL decodes each image in the
  DataLoader worker that read it (costs CPU cores, one image at a time per worker);
- `JpegCropsOnDevice`: an `on_device` function for `device_feed.prefetch_to_device`;
  nvJPEG decodes the whole batch on the GPU (`torchvision.io.decode_jpeg(..., device=)`, one
  batched call) ahead of the step, in the stage's thread (costs GPU time).

Both cut each image at a random `crop` x `crop` window, flipped left-right at random (the
usual training augmentation), and give the feature as uint8 [rows, crop, crop, 3], channels
last, colour always (grey JPEGs are expanded); other features pass as they came. An image
smaller than the crop is an error naming its row in the batch and its size.
"""
from __future__ import annotations

import io
import warnings
from typing import TYPE_CHECKING, Callable

from PIL import Image

if TYPE_CHECKING:  # annotations only; torch is imported when a batch is cut
    import torch


def _too_small(feature: str, row: int, height: int, width: int, crop: int) -> ValueError:
    return ValueError(f"{feature!r}: the image in row {row} of the batch is {height}x{width}, "
                      f"smaller than the {crop}x{crop} crop")


class JpegCropsOnHost:
    """A batch's JPEG bytes in `feature` -> uint8 [rows, crop, crop, 3], decoded by PIL in the
    DataLoader worker that read the batch. The windows are drawn from a generator seeded by
    the worker's torch seed, which the DataLoader makes differ from worker to worker and
    epoch to epoch."""

    def __init__(self, feature: str, crop: int):
        self.feature, self.crop = feature, crop
        self._rng = None

    def __call__(self, batch: dict) -> dict:
        # numpy: 80 ms to import; only the CPU decode needs it, not the GPU crop
        import numpy as np

        if self._rng is None:
            # torch: 1.6 s to import, optional; importing this module needs no torch
            import torch

            self._rng = np.random.default_rng(torch.initial_seed() % 2 ** 32)
        encoded, crop = batch[self.feature], self.crop
        out = np.empty((len(encoded), crop, crop, 3), np.uint8)
        for row, data in enumerate(encoded):
            with Image.open(io.BytesIO(data)) as image:
                pixels = np.asarray(image if image.mode == "RGB" else image.convert("RGB"))
            height, width = pixels.shape[:2]
            if height < crop or width < crop:
                raise _too_small(self.feature, row, height, width, crop)
            top = self._rng.integers(0, height - crop + 1)
            left = self._rng.integers(0, width - crop + 1)
            window = pixels[top:top + crop, left:left + crop]
            out[row] = window[:, ::-1] if self._rng.random() < 0.5 else window
        return {**batch, self.feature: out}


def device_jpeg_decoder(device) -> Callable:
    """torchvision's batched `decode_jpeg` for `device`, or an error saying why it cannot
    run here (a device that is not CUDA, no torchvision)."""
    if device.type != "cuda":
        raise ValueError(f"nvJPEG decodes on a CUDA device, not {device}")
    # torchvision: optional (not installed here); only the nvJPEG decoder needs it
    from torchvision.io import ImageReadMode, decode_jpeg

    def decode(tensors: list, device) -> list:
        return decode_jpeg(tensors, mode=ImageReadMode.RGB, device=device)
    return decode


class JpegCropsOnDevice:
    """A batch's JPEG bytes in `feature` (the object array the reader gives) -> uint8
    [rows, crop, crop, 3] on a CUDA `device`: nvJPEG's batched decode of the whole list
    (the bytes stay in host memory, where nvJPEG reads them), then the windows cut on the
    device: one gather for a batch of one image size, one slice an image otherwise. Give it
    to `device_feed.prefetch_to_device(on_device=...)`, which runs it ahead of the step."""

    def __init__(self, feature: str, crop: int, device="cuda", seed: int = 0):
        # torch: 1.6 s to import, optional; importing this module needs no torch
        import torch

        self.device = torch.device(device)
        self._decode = device_jpeg_decoder(self.device)
        # torch.frombuffer over immutable bytes warns once a call; nvJPEG only reads them.
        warnings.filterwarnings("ignore", message="The given buffer is not writable")
        self.feature, self.crop = feature, crop
        self._generator = torch.Generator(device=self.device)
        self._generator.manual_seed(seed)

    def __call__(self, batch: dict) -> dict:
        # torch: 1.6 s to import, optional; importing this module needs no torch
        import torch

        decoded = self._decode([torch.frombuffer(data, dtype=torch.uint8)
                                for data in batch[self.feature]], device=self.device)
        shapes = [tuple(image.shape[1:]) for image in decoded]  # known on the host
        for row, (height, width) in enumerate(shapes):
            if height < self.crop or width < self.crop:
                raise _too_small(self.feature, row, height, width, self.crop)
        sizes = torch.tensor(shapes, device=self.device)

        def draw(highs):  # a random integer in [0, high) for each row
            return (torch.rand(len(highs), device=self.device, generator=self._generator)
                    * highs).long()

        tops, lefts = draw(sizes[:, 0] - self.crop + 1), draw(sizes[:, 1] - self.crop + 1)
        flips = draw(torch.full_like(tops, 2)).bool()
        if len(set(shapes)) == 1:
            crops = crop_windows(torch.stack(decoded), tops, lefts, flips, self.crop)
        else:
            crops = torch.stack([crop_windows(image[None], top[None], left[None], flip[None],
                                              self.crop)[0]
                                 for image, top, left, flip in zip(decoded, tops, lefts,
                                                                   flips)])
        return {**batch, self.feature: crops}


def crop_windows(images: "torch.Tensor", tops, lefts, flips, crop: int) -> "torch.Tensor":
    """uint8 [rows, channels, height, width] -> [rows, crop, crop, channels]: row i's window
    at (tops[i], lefts[i]), flipped left-right where flips[i], all cut by one gather on the
    images' device rather than a kernel an image."""
    # torch: 1.6 s to import, optional; importing this module needs no torch
    import torch

    steps = torch.arange(crop, device=images.device)
    ys = tops[:, None] + steps
    xs = torch.where(flips[:, None], lefts[:, None] + (crop - 1) - steps, lefts[:, None] + steps)
    rows = torch.arange(len(images), device=images.device)
    # Indices on dims 0, 2 and 3 around the channel slice: the result is [rows, crop, crop,
    # channels], channels last like the other paths' batches.
    return images[rows[:, None, None], :, ys[:, :, None], xs[:, None, :]]
