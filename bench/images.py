"""`tfrp bench images`: one JPEG file per image vs our TFRecord path, same images, one process.

Data: `count` 64x64 RGB JPEGs made from scikit-learn's digits (upscaled, tinted and noised
with a fixed seed) plus labels.csv. Our path is ShardedExampleGen's image output read by
`build_dataset` (the conversion is done once, beforehand, and not timed, as in training).
The peer is the tf.data guide's file-per-image pipeline: shuffled (path, label) pairs ->
parallel map(read_file, decode) -> batch -> prefetch, decoding with the same function
as ours (which resizes only images of another size). Both produce uint8
[batch, 64, 64, 3] batches; each pass is consumed inside the TF runtime.
"""
from __future__ import annotations

import csv
import json
import os
import statistics
import time
from typing import Callable

SIZE = 64
BATCH_SIZE = 64
SEED = 20241122


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


def _examples(images: str, out: str) -> str:
    from components.example_gen import beam_job
    from components.example_gen.options import ExampleGenOptions
    from components.shards import ShardingOptions

    if not os.path.exists(os.path.join(out, "manifest.json")):
        import shutil

        shutil.rmtree(out, ignore_errors=True)
        # JPEG bytes do not gzip (31 MB -> 31 MB here) but gunzip costs the reader CPU, so
        # image shards are written uncompressed; four shards let the interleave read in parallel.
        beam_job.run(ExampleGenOptions(source=images, format="images", splits="train:1",
                                       sharding=ShardingOptions(num_shards=4,
                                                                compression="none")), out)
    return out


def _time_pass(dataset, count: int) -> float:
    import tensorflow as tf

    start = time.perf_counter()
    seen = int(dataset.reduce(tf.constant(0, tf.int64),
                              lambda total, batch: total + tf.shape(batch[0], tf.int64)[0]))
    seconds = time.perf_counter() - start
    if seen != count:
        raise RuntimeError(f"one pass gave {seen} images, expected {count}")
    return seconds


def _ours(examples: str, count: int) -> float:
    from components.codec import schema_file
    from components.trainer.input import build_dataset
    from components.trainer.options import ImageSpec, InputConfig

    config = InputConfig(batch_size=BATCH_SIZE, num_epochs=1, shuffle_buffer=1000,
                         images={"image": ImageSpec(SIZE, SIZE, 3)})
    dataset = build_dataset(os.path.join(examples, "Split-train", "*"),
                            schema_file.load_schema(examples), "label", feature_keys=["image"],
                            config=config).map(lambda f, label: (f["image"], label))
    return _time_pass(dataset, count)


def _files(images: str, count: int) -> float:
    import tensorflow as tf

    with open(os.path.join(images, "labels.csv")) as f:
        rows = list(csv.DictReader(f))
    paths = [os.path.join(images, r["filename"]) for r in rows]
    labels = [int(r["label"]) for r in rows]

    from components.trainer.input import decode_image
    from components.trainer.options import ImageSpec

    spec = ImageSpec(SIZE, SIZE, 3)

    def load(path, label):  # the same decode (and resize when needed) as our path
        return decode_image(tf.io.read_file(path), spec), label

    dataset = (tf.data.Dataset.from_tensor_slices((paths, labels))
               .shuffle(len(paths), seed=SEED)
               .map(load, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
               .batch(BATCH_SIZE)
               .prefetch(tf.data.AUTOTUNE))
    return _time_pass(dataset, count)


def run_benchmark(count: int, work_root: str, repeats: int = 3,
                  log: Callable[[str], None] = print) -> dict:
    images = write_images(count, os.path.join(work_root, f"images-{count}"))
    examples = _examples(images, os.path.join(work_root, f"images-{count}-examples"))
    for folder in (images, examples):  # warm the page cache for both
        for root, _, files in os.walk(folder):
            for name in files:
                with open(os.path.join(root, name), "rb") as f:
                    f.read()
    seconds = {"ours": [], "files": []}
    for repeat in range(repeats):
        seconds["ours"].append(_ours(examples, count))
        seconds["files"].append(_files(images, count))
        log(f"repeat {repeat + 1}/{repeats}: ours {seconds['ours'][-1]:.2f}s, "
            f"files {seconds['files'][-1]:.2f}s")
    result = {"count": count, "repeats": repeats, "size": SIZE, "batch_size": BATCH_SIZE,
              "paths": {}}
    for path, values in seconds.items():
        median = statistics.median(values)
        result["paths"][path] = {"median_seconds": median, "images_per_second": count / median,
                                 "seconds": values}
    result["ratio"] = result["paths"]["files"]["median_seconds"] / \
        result["paths"]["ours"]["median_seconds"]
    return result


if __name__ == "__main__":
    import sys

    print(json.dumps(run_benchmark(int(sys.argv[1]), sys.argv[2], int(sys.argv[3])), indent=2))
