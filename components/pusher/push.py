"""A push: a SavedModel copied into a serving folder as a new numeric version, as TF Serving
reads it (`<serving_dir>/<version>/saved_model.pb`, newest = largest number). No TFX here:
the Pusher's executor, the model-in-production finder and the tests share it.

Two pushes never share a version folder, and no reader of ours sees a half-written one:
- the version is the push's time in microseconds, or one more than the newest version there
  when that is larger (a clock behind another machine's still pushes the newest); two pushes
  in the same microsecond, or a folder already there, take the next free number;
- the model is copied into `.staging-<version>-<push id>` beside the versions (a name TF
  Serving's version scan skips: not a number), `saved_model.pb` last, then a marker
  (`MARKER_FILE`) last of all, and only then moved to its number. On a disk the move is one
  atomic rename onto a name that must not exist; on a bucket, where a rename is a copy per
  object, the number is first claimed (`.claim-<version>`), the objects are copied data first,
  `saved_model.pb` next and the marker last, and the staging copy is deleted;
- readers (`pushed_versions`) take a version only with its marker: a push killed part-way on
  a bucket leaves a numeric folder without one, which they skip.
"""
from __future__ import annotations

import dataclasses
import errno
import time
import uuid
from typing import Callable, Optional

from tfrecord_shards import fileio

SAVED_MODEL_FILE = "saved_model.pb"
# Written last into a version folder: the push is complete. Hidden from listings of ours.
MARKER_FILE = "_PUSHED.json"
STAGING_PREFIX = ".staging-"
CLAIM_PREFIX = ".claim-"
# Versions below this are Unix times in seconds: the stock Pusher's folders, from before this
# one, which wrote no marker and copied saved_model.pb last; such a folder with saved_model.pb
# is a complete push. Ours are microseconds (above 10**15).
STOCK_VERSIONS_BELOW = 10 ** 11
# How many numbers past the first choice a push tries before it gives up.
MAX_CLASHES = 1000


class PushError(RuntimeError):
    """A push that could not find a free version; one line."""


@dataclasses.dataclass(frozen=True)
class Pushed:
    version: int
    destination: str  # <serving_dir>/<version>


def push(model_dir: str, serving_dir: str,
         on_copied: Optional[Callable[[str], None]] = None,
         clock: Callable[[], int] = time.time_ns) -> Pushed:
    """Pushes the SavedModel in `model_dir` to a new version folder of `serving_dir`.

    `on_copied(path)` is called after each file is written (the staging copy, then on a bucket
    each object copied into the version folder): the fault tests stop a push there.
    `clock` gives nanoseconds since the epoch."""
    push_id = uuid.uuid4().hex
    fileio.makedirs(serving_dir)
    version = max(clock() // 1000, newest_number(serving_dir) + 1)
    staging = fileio.join(serving_dir, f"{STAGING_PREFIX}{version}-{push_id}")
    files = _copy_model(model_dir, staging, on_copied)
    # The folder's name is the version: a clash below may still change it.
    fileio.write_json(fileio.join(staging, MARKER_FILE), {
        "push_id": push_id, "source": model_dir, "pushed_at_ns": clock()})
    first = version
    for version in range(first, first + MAX_CLASHES):
        target = fileio.join(serving_dir, str(version))
        if fileio.exists(target):
            continue
        if not fileio.is_remote(serving_dir):
            try:
                fileio.rename(staging, target)  # atomic, and refused onto a non-empty folder
            except OSError as e:
                if e.errno in (errno.EEXIST, errno.ENOTEMPTY):
                    continue  # another push took this number between the look and the move
                raise
            return Pushed(version, target)
        if _publish_on_store(staging, serving_dir, version, push_id, files, on_copied):
            return Pushed(version, target)
    raise PushError(f"{serving_dir}: versions {first} to {first + MAX_CLASHES - 1} are all "
                    f"taken; the model is left in {staging}")


def pushed_versions(serving_dir: str) -> list[tuple[int, str]]:
    """The complete pushes in `serving_dir`, oldest first, as (version, folder): a numeric
    folder with the marker (or a stock Pusher's seconds folder with saved_model.pb). A push
    still being copied, or killed part-way, is not one."""
    if not fileio.isdir(serving_dir):
        return []
    found = []
    for name in fileio.listdir(serving_dir):
        if not name.isdigit():
            continue
        folder = fileio.join(serving_dir, name)
        if is_complete(folder, int(name)):
            found.append((int(name), folder))
    return sorted(found)


def is_complete(folder: str, version: int) -> bool:
    if fileio.exists(fileio.join(folder, MARKER_FILE)):
        return True
    return version < STOCK_VERSIONS_BELOW and fileio.exists(
        fileio.join(folder, SAVED_MODEL_FILE))


def newest_number(serving_dir: str) -> int:
    """The largest numeric name in `serving_dir`, complete or not (0 when none): a new
    version is above every folder TF Serving could list."""
    if not fileio.isdir(serving_dir):
        return 0
    return max((int(n) for n in fileio.listdir(serving_dir) if n.isdigit()), default=0)


def _copy_model(model_dir: str, staging: str,
                on_copied: Optional[Callable[[str], None]]) -> list[str]:
    """Copies every file of `model_dir` into `staging`, saved_model.pb last (TF Serving and
    TensorFlow take it as the sign that a SavedModel is there); the relative paths, in the
    order a bucket's publish copies them."""
    files = _in_publish_order(model_dir)
    for relative in files:
        target = fileio.join(staging, *fileio.parts(relative))
        fileio.makedirs(fileio.dirname(target))
        fileio.copy_file(fileio.join(model_dir, *fileio.parts(relative)), target)
        if on_copied:
            on_copied(target)
    return files


def _in_publish_order(folder: str) -> list[str]:
    files = [fileio.relpath(fileio.join(root, name), folder)
             for root, _, names in fileio.walk(folder) for name in names]
    return sorted(files, key=lambda f: (f == SAVED_MODEL_FILE, f))


def _publish_on_store(staging: str, serving_dir: str, version: int, push_id: str,
                      files: list[str], on_copied: Optional[Callable[[str], None]]) -> bool:
    """Copies the staged push into `<serving_dir>/<version>` on an object store, the marker
    last; False when another push holds the number. The claim is a look then a write (an
    object store through pyarrow has no create-if-absent), read back to see who won."""
    claim = fileio.join(serving_dir, f"{CLAIM_PREFIX}{version}")
    if fileio.exists(claim):
        return False
    fileio.write_text(claim, push_id)
    if fileio.read_text(claim) != push_id or \
            fileio.exists(fileio.join(serving_dir, str(version))):
        return False
    target = fileio.join(serving_dir, str(version))
    # The folder's own object: a store's listing of the serving folder (ours, pyarrow's)
    # shows a folder by it, not by the objects below it.
    fileio.makedirs(target)
    for relative in [*files, MARKER_FILE]:
        destination = fileio.join(target, *fileio.parts(relative))
        fileio.copy_file(fileio.join(staging, *fileio.parts(relative)), destination)
        if on_copied:
            on_copied(destination)
    fileio.rmtree(staging)
    fileio.remove(claim)
    return True


def read_marker(folder: str) -> Optional[dict]:
    """What a push's marker records (push id, source model, time), or None."""
    text = fileio.read_json(fileio.join(folder, MARKER_FILE))
    return text if isinstance(text, dict) else None
