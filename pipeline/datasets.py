"""Datasets that ship inside installed packages, found at run time rather than copied in."""
from __future__ import annotations

import csv
import os

import numpy as np
from PIL import Image

from components.example_gen.sources.locate import TAXI_SOURCE
from pipeline.configs import PipelineConfig

TAXI = "taxi"
DIGITS = "digits"


def source_for(config: PipelineConfig, local: bool = True) -> str:
    """What ExampleGen reads: the configured data_root, else the dataset's bundled data.

    The taxi sample is named, not pathed, so a compiled pipeline finds it inside the image.
    Digits are written out as image files first, which only a local run can see.
    """
    if config.data_root:
        return config.data_root
    if config.dataset == TAXI:
        return TAXI_SOURCE
    if config.dataset == DIGITS:
        if not local:
            raise ValueError(
                "the digits images are written to local disk; for Kubeflow or Vertex, copy "
                "them to shared storage (gsutil -m cp -r) and set data_root to that folder")
        return os.path.abspath(write_digits_images(
            os.path.join(config.output_root, "datasets", DIGITS)))
    raise ValueError(f"dataset {config.dataset!r} has no bundled data; set data_root")


def write_digits_images(folder: str, limit: int | None = None) -> str:
    """scikit-learn's bundled handwritten digits (1,797 8x8 images) as PNG files plus a
    labels.csv, the folder layout our ExampleGen reads. Written once; returns `folder`."""
    # sklearn: 0.3 s to import; only the digits sample needs it.
    from sklearn.datasets import load_digits

    labels_path = os.path.join(folder, "labels.csv")
    if os.path.exists(labels_path):
        return folder
    digits = load_digits()
    count = len(digits.images) if limit is None else min(limit, len(digits.images))
    os.makedirs(os.path.join(folder, "images"), exist_ok=True)
    partial = labels_path + ".partial"  # renamed last, so a crash never leaves a short set
    with open(partial, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["filename", "label"])
        for i in range(count):
            # Pixel values run 0..16; spread them over 0..255 so the PNGs look like images.
            pixels = np.round(digits.images[i] * (255 / 16)).astype(np.uint8)
            name = f"images/{i:04d}.png"
            Image.fromarray(pixels, mode="L").save(os.path.join(folder, name))
            writer.writerow([name, int(digits.target[i])])
    os.replace(partial, labels_path)
    return folder
