"""TensorFlow's file systems for the URIs a process is about to use.

Our own file layer (tfrecord_shards/fileio.py) reaches gs:// and s3:// through pyarrow and never
imports TensorFlow. The stock TFX components (SchemaGen, ExampleValidator, the Trainer's model
saving, Evaluator, Pusher), tf.Transform and TensorFlow itself go through `tf.io.gfile`, which
in TensorFlow 2.16 has gs:// built in but s3:// only once tensorflow-io has registered its
plugin (`import tensorflow_io`). tf.Transform and TFMA import tensorflow_io themselves whenever
it is installed, in every process that imports them (Beam's worker processes included), so
that import alone is not what a run on s3:// lacks: tensorflow-io's S3 client reads its
endpoint from S3_ENDPOINT, not from AWS_ENDPOINT_URL as boto3, Beam and our file layer do.

tensorflow-io 0.37.1's S3 file system differs from a plain object store in ways callers must
know: its rename moves every object whose key *starts with* the source key (renaming `a` also
moves `a.idx` to `b.idx`), it copies (and so renames) no empty object, a file closed with
nothing written leaves no object, and `makedirs` writes no folder marker. Our own renames go
through fileio, on exact keys.
"""
from __future__ import annotations

import os
import re
from typing import Optional, Sequence

from tfrecord_shards import fileio


def needs_tensorflow_io(*uris: Optional[str]) -> bool:
    """Whether any of the URIs is on s3://, which tf.io.gfile reaches only through
    tensorflow-io."""
    return any(uri and uri.startswith("s3://") for uri in uris)


def register_for(*uris: Optional[str]) -> bool:
    """Makes tf.io.gfile able to open the URIs given (None and other schemes are skipped);
    True when tensorflow-io was loaded for them. Call it before the first s3:// access.

    It leaves the process's exit alone. Once its S3 client has connected, tensorflow-io
    0.37.1 aborts in C++ after Python has finished exiting (the AWS SDK's static EC2
    metadata client is destroyed after the SDK's logger: "pure virtual method called",
    SIGABRT), whatever status Python exits with. Our entry points end their process before
    that (pipeline/process_exit.py); a program of the caller's exits as a program that
    imports tensorflow-io does, its own exit handlers and output untouched by us."""
    if not needs_tensorflow_io(*uris):
        return False
    endpoint = fileio.s3_endpoint()
    if endpoint:
        # Read by tensorflow-io's S3 client when it first connects; set in the environment,
        # it also reaches the processes this one starts (Beam's DirectRunner workers).
        os.environ.setdefault("S3_ENDPOINT", endpoint)
    try:
        # tensorflow_io: optional, 3.7 s to import; only s3:// through tf.io.gfile needs it
        import tensorflow_io  # noqa: F401  registers s3:// with tf.io.gfile
    except ImportError as e:
        first = next(uri for uri in uris if needs_tensorflow_io(uri))
        raise fileio.StorageError(
            first, "TensorFlow reaches s3:// only through tensorflow-io, which is not "
            "installed here (pip install the tensorflow-io of constraints.txt)", str(e)) from e
    return True


def register_for_arguments(arguments: Sequence[str]) -> bool:
    """`register_for` the s3:// URIs named anywhere in a command's arguments (a Kubeflow
    task's executor input is JSON in one argument)."""
    return register_for(*re.findall(r"s3://[^\s\"'\\]+", " ".join(arguments)))

