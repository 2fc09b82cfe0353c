"""TensorFlow's file systems for the URIs a process is about to use.

Our own file layer (components/fileio.py) reaches gs:// and s3:// through pyarrow and never
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

import atexit
import ctypes
import os
import re
from typing import Optional, Sequence

from components import fileio


def needs_tensorflow_io(*uris: Optional[str]) -> bool:
    """Whether any of the URIs is on s3://, which tf.io.gfile reaches only through
    tensorflow-io."""
    return any(uri and uri.startswith("s3://") for uri in uris)


def register_for(*uris: Optional[str]) -> bool:
    """Makes tf.io.gfile able to open the URIs given (None and other schemes are skipped);
    True when tensorflow-io was loaded for them. Call it before the first s3:// access.
    Once its S3 client has connected, tensorflow-io aborts the process's exit in C++: our
    entry points end the process before that (pipeline/process_exit.py), and any other
    program ends with its own status (`end_without_native_teardown`)."""
    if not needs_tensorflow_io(*uris):
        return False
    endpoint = fileio.s3_endpoint()
    if endpoint:
        # Read by tensorflow-io's S3 client when it first connects; set in the environment,
        # it also reaches the processes this one starts (Beam's DirectRunner workers).
        os.environ.setdefault("S3_ENDPOINT", endpoint)
    try:
        import tensorflow_io  # noqa: F401  registers s3:// with tf.io.gfile
    except ImportError as e:
        first = next(uri for uri in uris if needs_tensorflow_io(uri))
        raise fileio.StorageError(
            first, "TensorFlow reaches s3:// only through tensorflow-io, which is not "
            "installed here (pip install the tensorflow-io of constraints.txt)", str(e)) from e
    end_without_native_teardown()
    return True


def register_for_arguments(arguments: Sequence[str]) -> bool:
    """`register_for` the s3:// URIs named anywhere in a command's arguments (a Kubeflow
    task's executor input is JSON in one argument)."""
    return register_for(*re.findall(r"s3://[^\s\"'\\]+", " ".join(arguments)))


_guarded = False


def end_without_native_teardown() -> None:
    """Once tensorflow-io's S3 client has connected, a process aborts in C++ after Python has
    finished exiting (tensorflow-io 0.37.1 with TensorFlow 2.16: the AWS SDK's static EC2
    metadata client is destroyed after the SDK's logger; "pure virtual method called",
    SIGABRT, status 134) whatever status Python exits with, so a user's program that read a
    bucket through our readers would report a failure. This makes C's exit(), which Python
    calls with its status after its own finalization, call `_exit` with that status first:
    glibc's `on_exit` hands the handler the status, and a handler registered last runs
    first, so it is registered at Python's exit, after whatever the S3 client registered
    when it connected. Only the native libraries' static destructors are skipped. Without
    `on_exit` (musl) nothing is installed."""
    global _guarded
    if not _guarded:
        atexit.register(_register_exit_handler)
        _guarded = True


def _register_exit_handler() -> None:
    libc = ctypes.CDLL(None)
    if hasattr(libc, "on_exit"):
        libc.on_exit(ctypes.cast(libc._exit, ctypes.c_void_p), None)
