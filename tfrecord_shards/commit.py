"""Staged output and its commit: everything of a sharded output is written under a staging
folder beside the output (`staged_output`) and moved into place at the end, manifest last,
with a `_COMMITTING` marker from the first move until after the manifest; `check_committed`
lets readers refuse an output whose commit was stopped, and `clear_earlier_attempt` clears
what a retried task's first attempt left."""
from __future__ import annotations

import contextlib
import logging
import time
import uuid
from typing import Iterator

from tfrecord_shards import fileio, hooks
from tfrecord_shards.codec.schema_file import SCHEMA_FILE
from tfrecord_shards.manifest import MANIFEST_FILE

STAGING_PREFIX = ".staging-"
# Written into the output before the first move of a commit and removed after the manifest:
# on an object store a commit is a copy per object, and a reader that finds this file
# without a manifest knows the output is partial (a `_` name: no stock reader lists it).
COMMITTING_FILE = "_COMMITTING"


def check_output_dir(output_dir: str) -> None:
    """Refuses an output folder that holds anything: a finished output is never overwritten,
    and the remains of a run that was killed (outputs moved in before the manifest) are named,
    with what to delete, rather than mixed into a new output."""
    entries = sorted(n for n in fileio.listdir(output_dir)) \
        if fileio.isdir(output_dir) else []
    if not entries:
        return
    if MANIFEST_FILE in entries:
        raise FileExistsError(f"{output_dir} already holds a finished output ({MANIFEST_FILE} "
                              "is there); write to an empty folder")
    stopped = " left by a run that stopped before it finished (no manifest.json)" \
        if COMMITTING_FILE in entries or any(n.startswith("Split-") for n in entries) else ""
    delete = f"gsutil -m rm -r {output_dir}" if output_dir.startswith("gs://") else \
        f"aws s3 rm --recursive {output_dir}" if output_dir.startswith("s3://") else \
        f"rm -r {output_dir}"
    raise FileExistsError(f"{output_dir} is not empty: it holds {', '.join(entries[:5])}"
                          f"{' ...' if len(entries) > 5 else ''}{stopped}; delete the folder "
                          f"({delete}) or write to an empty one")


def clear_earlier_attempt(output_dir: str) -> None:
    """Removes what an earlier attempt of the same task left in `output_dir` and the staging
    folders beside it (a commit stopped half-way, a job killed before it): an orchestrator
    retries a task into the URIs it gave the first attempt, and the retry must write whole.
    For executors only, whose output folder is their task's alone; `staged_output` itself
    refuses a folder that is not empty, which keeps a user's own folder safe."""
    output_dir = output_dir.rstrip("/")
    parent = fileio.dirname(output_dir)
    prefix = f"{STAGING_PREFIX}{fileio.basename(output_dir)}-"
    if fileio.isdir(parent):
        for name in fileio.listdir(parent):
            if name.rstrip("/").startswith(prefix):
                fileio.rmtree(fileio.join(parent, name.rstrip("/")))
    if fileio.isdir(output_dir) and fileio.listdir(output_dir):
        fileio.rmtree(output_dir)


def new_staging_dir(output_dir: str) -> str:
    """A fresh staging folder beside `output_dir`, never inside it: nothing of a run in
    progress is below the folder a reader lists, on a disk or a bucket."""
    output_dir = output_dir.rstrip("/")
    staging = fileio.join(fileio.dirname(output_dir), f"{STAGING_PREFIX}"
                          f"{fileio.basename(output_dir)}-{uuid.uuid4().hex[:12]}")
    fileio.makedirs(staging)
    return staging


def commit(staging: str, output_dir: str) -> None:
    """Moves staged results into `output_dir`; the manifest goes last and marks completion.

    On a disk each top-level entry is one rename. On an object store every object is copied
    and deleted, so a kill can stop a commit half-way: `COMMITTING_FILE` is there from the
    first move until after the manifest, and `check_committed` refuses such a folder."""
    names = fileio.listdir(staging)
    fileio.makedirs(output_dir)
    marker = fileio.join(output_dir, COMMITTING_FILE)
    fileio.write_text(marker, staging)
    # The data first, then the schema, the manifest last: a run killed part-way through the
    # moves leaves shards without a schema or without a manifest, never a complete look.
    last = {SCHEMA_FILE: 1, MANIFEST_FILE: 2}
    moved = 0
    hooks.reached(hooks.COMMIT_MOVED, moved=moved)
    for name in sorted(names, key=lambda n: (last.get(n, 0), n)):
        if fileio.is_hidden(name):
            continue
        target = fileio.join(output_dir, name)
        if fileio.exists(target):
            if fileio.isdir(target):
                fileio.rmtree(target)
            else:
                fileio.remove(target)
        fileio.rename(fileio.join(staging, name), target)
        moved += 1
        hooks.reached(hooks.COMMIT_MOVED, moved=moved)
    fileio.remove(marker)
    fileio.rmtree(staging)


def check_committed(folder: str) -> None:
    """Refuses an output of ours whose commit was stopped (shards without their manifest):
    a reader of it would count some rows, or some twice."""
    if fileio.exists(fileio.join(folder, COMMITTING_FILE)) and \
            not fileio.exists(fileio.join(folder, MANIFEST_FILE)):
        raise IncompleteOutputError(
            f"{folder}: an unfinished output: a run stopped while moving it into place "
            f"({COMMITTING_FILE} is there and {MANIFEST_FILE} is not); run it again into an "
            "empty folder")


class IncompleteOutputError(ValueError):
    pass


# A failed distributed job's other tasks can go on writing into the staging folder for a
# moment after the driver learns of the first failure (Spark cancels them without waiting):
# a removal that races them finds a folder filled again under it, and is tried again.
DISCARD_ATTEMPTS = 20
DISCARD_PAUSE_SECONDS = 0.25


def discard(staging: str) -> None:
    """Removes a failed run's staging folder. It never raises: the run's own error is the
    one to report, and a folder still being written after every attempt is named in a
    warning instead (it sits beside the output, never inside it)."""
    for attempt in range(DISCARD_ATTEMPTS):
        try:
            if fileio.exists(staging):
                fileio.rmtree(staging)
            return
        except OSError as error:
            if attempt == DISCARD_ATTEMPTS - 1:
                logging.warning("The failed run's staging folder %s could not be removed "
                                "(%s); delete it", staging, error)
                return
            time.sleep(DISCARD_PAUSE_SECONDS)


@contextlib.contextmanager
def staged_output(output_dir: str) -> Iterator[str]:
    """A fresh staging folder beside `output_dir`, committed into it when the block succeeds
    and removed when it fails, so a failed run leaves nothing that looks complete.
    `output_dir` must be empty (check_output_dir)."""
    check_output_dir(output_dir)
    staging = new_staging_dir(output_dir)
    try:
        yield staging
        commit(staging, output_dir)
    except BaseException:
        discard(staging)
        raise

