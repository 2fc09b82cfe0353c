"""What `tfrp` prints: quiet by default (the libraries' own logs and warnings hidden, back
with -v), and a command's error in one line (the traceback with -v)."""
from __future__ import annotations

import logging
import os
import re
import warnings

import click

from tfrecord_shards import fileio

# Libraries whose INFO and WARNING lines are about their own internals (TFX's metadata queries,
# Beam's missing snappy, TF's deprecation notices), not about the user's data or model.
_LIBRARY_LOGGERS = ("absl", "tensorflow", "apache_beam", "tfx", "tfx_bsl", "ml_metadata",
                    "tensorflow_transform", "tensorflow_data_validation",
                    "tensorflow_model_analysis")


_FAILED_EXECUTION = re.compile(r"^Execution \d+ failed\.$")


def one_line(error: BaseException) -> str:
    """An error as a command prints it: ours (raised by components/) say what went wrong in
    their message; another library's is named by its type too."""
    if type(error).__module__.split(".")[0] == "components":
        return str(error)
    return f"{type(error).__name__}: {error}"


# `-v/--verbose`, on each command group (tfrp's, the benchmarks'), which hands it to
# configure_output.
verbose_option = click.option("-v", "--verbose", is_flag=True,
                              help="Log at INFO level, with the libraries' own logs and "
                                   "warnings.")


def configure_output(verbose: bool) -> None:
    """Quiet by default: TensorFlow's C++ start-up lines, the libraries' internal warnings and
    Google's Python 3.11 FutureWarnings are hidden, and come back with -v. Our own warnings
    (damaged files, anomalies) are the user's business and always show. It runs before any
    TensorFlow import, which reads TF_CPP_MIN_LOG_LEVEL once."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if verbose:
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "0"
        return
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    warnings.filterwarnings("ignore", category=FutureWarning, module="google")
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    # Keras on loading a model with Lambda layers (the Evaluator, the warm start).
    warnings.filterwarnings("ignore", category=UserWarning, module="tf_keras")
    # On the handler, not the loggers: absl and TFX set their own loggers' levels later.
    for handler in logging.getLogger().handlers:
        handler.addFilter(_library_errors_only)


def _library_errors_only(record: logging.LogRecord) -> bool:
    library = record.name.split(".", 1)[0] in _LIBRARY_LOGGERS
    if record.name.startswith("apache_beam.runners") and record.exc_info:
        # A step's exception as Beam logs it on its way up, with its traceback: the command
        # says the same error itself, in one line.
        return False
    if record.name == "absl" and _FAILED_EXECUTION.match(record.getMessage()):
        return False  # TFX's launcher on a component's failure; the command names the error
    return not library or record.levelno >= logging.ERROR


class Commands(click.Group):
    """Every command's error from an object store (credentials, endpoint, not found, a
    scheme nothing here reaches) is one line naming the URI; with -v, the traceback."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except fileio.StorageError as e:
            if logging.getLogger().isEnabledFor(logging.INFO):
                raise
            raise click.ClickException(str(e)) from None
