"""`python -m bench images`: one JPEG file per image vs our TFRecord paths, same images.

Data: `count` 64x64 RGB JPEGs made from scikit-learn's digits (upscaled, tinted and noised
with a fixed seed) plus labels.csv. Converted once beforehand, untimed, as in training:
  - `ours`: ShardedExampleGen's image output (the JPEG bytes), decoded in the input function;
  - `raw`: ShardedTransform with `image_storage="raw"`: pixels at 64x64x3, one row per
    Example, read with decode_raw and a reshape;
  - `raw-packed`: the same, packed 1,024 rows per Example (Transform's default).
The peer, `files`, is the tf.data guide's file-per-image pipeline: shuffled (path, label)
pairs -> parallel map(read_file, decode) -> batch -> prefetch, decoding with the same
function as ours (`shard_readers.images.decode_image`). Every path yields uint8
[batch, 64, 64, 3] batches, consumed inside the TF runtime.

Where gperftools' tcmalloc is installed (Debian: libtcmalloc-minimal4), the files path and
the raw paths also run with it preloaded (`+tcmalloc`), the allocator TensorFlow's performance
guide recommends: with glibc's malloc the raw paths' large tensors are page-faulted in afresh
every epoch. Each path's best allocator is the one to compare.

Each side is a whole child process (bench/processes.py) that builds its dataset and reads two
epochs (nothing cached). The rate is the second epoch's, which is every later epoch's; the
first epoch, which also builds the dataset and traces its functions, and the whole process
time, imports included, are reported beside. Bytes on disk per image are reported for
every path.
"""
from __future__ import annotations

import csv
import json
import os
import sys
from typing import Callable, Optional

from bench import processes
from bench.display import MEDIAN, PROCESS, RATE, Table

SIZE = 64
BATCH_SIZE = 64
SEED = 20241122
PATHS = ("files", "ours", "raw", "raw-packed")  # the first is the baseline
TCMALLOC_PATHS = ("files", "raw", "raw-packed")
TCMALLOC = "+tcmalloc"


def _tcmalloc() -> Optional[str]:
    import ctypes.util

    return ctypes.util.find_library("tcmalloc_minimal") or ctypes.util.find_library("tcmalloc")


def write_images(count: int, folder: str) -> str:
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_digits

    labels_path = os.path.join(folder, "labels.csv")
    stamp = os.path.join(folder, "stamp")
    if os.path.exists(stamp) and open(stamp).read() == f"{count}:{SEED}":
        return folder
    os.makedirs(os.path.join(folder, "img"), exist_ok=True)
    digits = load_digits()
    rng = np.random.default_rng(SEED)
    with open(labels_path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["filename", "label"])
        for i in range(count):
            k = int(rng.integers(len(digits.images)))
            gray = Image.fromarray((digits.images[k] * 15).astype(np.uint8)).resize(
                (SIZE, SIZE), Image.BILINEAR)
            tint = rng.uniform(0.4, 1.0, 3)
            pixels = np.asarray(gray, np.float64)[:, :, None] * tint + \
                rng.normal(0, 12, (SIZE, SIZE, 3))
            name = f"img/{i:06d}.jpg"
            Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(
                os.path.join(folder, name), quality=90)
            writer.writerow([name, int(digits.target[k])])
    with open(stamp, "w") as f:
        f.write(f"{count}:{SEED}")
    return folder


# Image shards are written uncompressed: JPEG bytes do not gzip (31 MB -> 31 MB here) and
# gunzip costs the reader CPU; four shards let the interleave read in parallel.
def _sharding():
    from tfrecord_shards.shards import ShardingOptions

    return ShardingOptions(num_shards=4, compression="none")


def _examples(images: str, out: str) -> str:
    from components.example_gen import beam_job
    from components.example_gen.options import ExampleGenOptions

    if not os.path.exists(os.path.join(out, "manifest.json")):
        import shutil

        shutil.rmtree(out, ignore_errors=True)
        beam_job.run(ExampleGenOptions(source=images, format="images", splits="train:1",
                                       sharding=_sharding()), out)
    return out


def _raw(examples: str, out: str, packed_rows: int) -> str:
    from tfrecord_shards.codec import schema_file
    from components.transform import beam_job
    from components.transform.options import TransformOptions

    data = os.path.join(out, "examples")
    if not os.path.exists(os.path.join(data, "manifest.json")):
        import shutil

        shutil.rmtree(out, ignore_errors=True)
        options = TransformOptions(image_storage="raw", image_shape=[SIZE, SIZE, 3],
                                   packed_rows=packed_rows, label_key="label",
                                   sharding=_sharding())
        beam_job.run(options, examples, schema_file.load_schema(examples),
                     os.path.join(out, "graph"), data)
    return data


def _shard_bytes(examples: str) -> int:
    """The data files' bytes: everything under the Split-*/ folders."""
    return sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(examples)
               if os.path.basename(root).startswith("Split-") for f in files)


def _jpeg_bytes(images: str) -> int:
    return sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(images)
               for f in files if f.endswith(".jpg"))


def _one_epoch(dataset) -> int:
    import tensorflow as tf

    return int(dataset.reduce(tf.constant(0, tf.int64),
                              lambda total, batch: total + tf.shape(batch[0], tf.int64)[0]))


def _shards_dataset(examples: str):
    from tfrecord_shards.codec import schema_file
    from shard_readers.images import ImageSpec
    from components.trainer.input import build_dataset
    from components.trainer.options import InputConfig

    config = InputConfig(batch_size=BATCH_SIZE, num_epochs=1, shuffle_buffer=1000,
                         image_specs={"image": ImageSpec(SIZE, SIZE, 3)})
    return build_dataset(os.path.join(examples, "Split-train", "*"),
                         schema_file.load_schema(examples), "label", feature_keys=["image"],
                         config=config).map(lambda f, label: (f["image"], label))


def _files_dataset(images: str):
    import tensorflow as tf

    from shard_readers.images import ImageSpec, decode_image

    with open(os.path.join(images, "labels.csv")) as f:
        rows = list(csv.DictReader(f))
    paths = [os.path.join(images, r["filename"]) for r in rows]
    labels = [int(r["label"]) for r in rows]
    spec = ImageSpec(SIZE, SIZE, 3)

    def load(path, label):  # the same decode (and resize when needed) as our paths
        return decode_image(tf.io.read_file(path), spec), label

    return (tf.data.Dataset.from_tensor_slices((paths, labels))
            .shuffle(len(paths), seed=SEED)
            .map(load, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
            .batch(BATCH_SIZE)
            .prefetch(tf.data.AUTOTUNE))


def _child(path: str, folder: str) -> dict:
    """Builds the path's dataset and reads two epochs: the first (the dataset built, its
    functions traced, every file read) and a second, the rate of every later epoch."""
    import time

    import tensorflow as tf  # noqa: F401  imports are in the process time, not the epochs'

    import components.trainer.input  # noqa: F401

    start = time.perf_counter()
    dataset = _files_dataset(folder) if path == "files" else _shards_dataset(folder)
    first = _one_epoch(dataset)
    first_seconds = time.perf_counter() - start
    start = time.perf_counter()
    images = _one_epoch(dataset)
    if images != first:
        raise RuntimeError(f"{path}: the first epoch gave {first} images, the second {images}")
    return {"rows": images, "seconds": time.perf_counter() - start,
            "first_epoch_seconds": first_seconds}


def run_benchmark(count: int, work_root: str, repeats: int = 3,
                  log: Callable[[str], None] = print) -> dict:
    images = write_images(count, os.path.join(work_root, f"images-{count}"))
    examples = _examples(images, os.path.join(work_root, f"images-{count}-examples"))
    folders = {"files": images, "ours": examples,
               "raw": _raw(examples, os.path.join(work_root, f"images-{count}-raw"), 0),
               "raw-packed": _raw(examples, os.path.join(work_root, f"images-{count}-raw-packed"),
                                  1024)}
    for folder in folders.values():  # warm the page cache for every path alike
        for root, _, files in os.walk(folder):
            for name in files:
                with open(os.path.join(root, name), "rb") as f:
                    f.read()
    tcmalloc = _tcmalloc()
    if not tcmalloc:
        log("tcmalloc not found (Debian: libtcmalloc-minimal4): glibc's malloc only")
    paths = list(PATHS) + [path + TCMALLOC for path in TCMALLOC_PATHS if tcmalloc]

    def measure(path: str) -> dict:
        base = path.removesuffix(TCMALLOC)
        return processes.run_child("bench.images", [base, folders[base]],
                                   env={"LD_PRELOAD": tcmalloc} if path != base else None)

    result = processes.interleaved(paths, repeats, count, measure, log,
                                   also=["first_epoch_seconds"])
    on_disk = {path: _jpeg_bytes(folder) if path == "files" else _shard_bytes(folder)
               for path, folder in folders.items()}
    # The peer with its best allocator: the faster of its runs with and without tcmalloc.
    best_files = max(result["paths"][path]["rows_per_second"] for path in paths
                     if path.removesuffix(TCMALLOC) == "files")
    for path, entry in result["paths"].items():
        entry["images_per_second"] = entry["rows_per_second"]
        entry["vs_best_files"] = entry["rows_per_second"] / best_files
        entry["bytes_per_image"] = on_disk[path.removesuffix(TCMALLOC)] / count
    return dict(result, count=count, size=SIZE, batch_size=BATCH_SIZE, tcmalloc=tcmalloc)


def table(result: dict) -> Table:
    return Table(result["paths"], [
        RATE, MEDIAN, ("1st epoch s", "median_first_epoch_seconds", "{:.2f}"), PROCESS,
        ("vs files", "vs_baseline", "{:.2f}x"), ("vs files' best", "vs_best_files", "{:.2f}x"),
        ("bytes/image", "bytes_per_image", "{:,.0f}")])


if __name__ == "__main__":
    print(json.dumps(_child(sys.argv[1], sys.argv[2])))
