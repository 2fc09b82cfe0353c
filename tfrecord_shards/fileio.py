"""The one file layer: local paths and URIs (gs://, s3://, hdfs://, ...), with no TensorFlow.

Every artifact, source and serving path of ours is a URI and goes through here: joining and
splitting them (`join`, `dirname`, `basename`, `relpath`: `os.path` turns `gs://b` into
`gs:/b`), making a local one absolute (`absolute`; a URI is left alone), and reading, writing
and listing them. Local paths use Python's own file functions; a URI goes to `pyarrow.fs`
(Google Cloud Storage, S3 and HDFS in the pyarrow we already pin), so the readers that run
without TensorFlow (numpy_reader, random_access, record_index) read buckets too. Stock TFX
components keep `tf.io.gfile`; `storage_settings` says which variables reach both.

Object stores have no folders and no rename: a "folder" is a key prefix, and a rename is a
copy and a delete per object (`rename` never moves a name that merely prefixes another, as
a prefix rename would). An error from a store names the URI and the cause (`StorageError`).

This module is the layer's whole interface. The machinery of the stores (the filesystems,
where the stores are found, their errors) is `object_stores`, and files' versions
(generations, ETags) are `file_versions`; what callers use of both is re-exported here.
"""
from __future__ import annotations

import contextlib
import fnmatch
import functools
import glob as local_glob
import io
import json
import os
import posixpath
import re
import shutil
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator, Optional, Sequence

# Imported here for callers too, which use them as `fileio.X` (FileVersion, file_versions,
# versions_below, S3_ALIASES, s3_endpoint, s3_region, storage_settings, store_cause, ...).
from tfrecord_shards.file_versions import FileVersion, file_versions, versions_below
from tfrecord_shards.object_stores import (REMOTE_READERS, S3_ALIASES, RemoteFile,
                                           StorageError, calling_store, entries, file_info,
                                           filesystem, is_remote, s3_endpoint, s3_region,
                                           scheme, storage_settings, store_cause)

# Names a reader of our outputs never lists: staging and bookkeeping (`.staging-*`,
# `_attempts`, `_chunks`, `.crc`, `_SUCCESS`).
HIDDEN_PREFIXES = (".", "_")


# ---- names --------------------------------------------------------------------------------

def join(base: str, *parts: str) -> str:
    return posixpath.join(base, *parts) if is_remote(base) else os.path.join(base, *parts)


def dirname(path: str) -> str:
    if not is_remote(path):
        return os.path.dirname(path)
    head = posixpath.dirname(path.rstrip("/"))
    return head if "://" in head and head.split("://", 1)[1] else path.rstrip("/")


def basename(path: str) -> str:
    return posixpath.basename(path.rstrip("/")) if is_remote(path) else \
        os.path.basename(path)


def relpath(path: str, start: str) -> str:
    """`path` relative to the folder `start` (both local or both URIs)."""
    if not is_remote(path):
        return os.path.relpath(path, start)
    prefix = start.rstrip("/") + "/"
    if path.rstrip("/") == start.rstrip("/"):
        return "."
    if not path.startswith(prefix):
        raise ValueError(f"{path} is not below {start}")
    return path[len(prefix):]


def parts(relative: str) -> list[str]:
    """The names along a relative path."""
    return [p for p in re.split(r"[/\\]" if os.sep == "\\" else "/", relative) if p not in
            ("", ".")]


def absolute(path: str) -> str:
    """A local path made absolute (TFX records artifact URIs as given); a URI as it is,
    without a trailing slash."""
    if is_remote(path):
        return path.rstrip("/")
    return os.path.abspath(path)


def is_hidden(name: str) -> bool:
    return name.startswith(HIDDEN_PREFIXES)


def has_hidden_part(path: str, top: str) -> bool:
    """Whether any name between `top` and `path` is hidden (`.staging-*/`, `_attempts/`)."""
    return any(is_hidden(p) for p in parts(relpath(path, top)))


# ---- reading and writing ------------------------------------------------------------------

# A read of a URI file is one request; reading ahead this much makes a stream of small reads
# (a record's header, then its body) a request per 4 MiB, not one per read.
REMOTE_READ_AHEAD = 4 << 20


def open_file(path: str, mode: str = "rb", buffered: bool = True):
    """A file object: seekable for reading ("rb", "r"), a stream for writing ("wb", "w").
    A URI read is buffered (REMOTE_READ_AHEAD) unless `buffered` is False, for positional
    reads of a few records each (random access). On an object store a written file appears
    whole when it is closed."""
    if not is_remote(path):
        return open(path, mode)
    store, inner = filesystem(path)
    with calling_store(path):
        if mode in ("rb", "r"):
            info = store.get_file_info(inner)
            if info.type.name != "File":
                raise FileNotFoundError(f"{path}: no such file")
            handle = RemoteFile(path, info.size)
            if buffered or mode == "r":
                handle = io.BufferedReader(handle, buffer_size=REMOTE_READ_AHEAD)
            return handle if mode == "rb" else io.TextIOWrapper(handle, encoding="utf-8")
        if mode in ("wb", "w"):
            # compression=None: pyarrow would gzip a ".gz" name by default; we write the bytes
            handle = store.open_output_stream(inner, compression=None)
            return handle if mode == "wb" else io.TextIOWrapper(handle, encoding="utf-8")
    raise ValueError(f"{path}: mode {mode!r} is not supported on an object store")


def read_bytes(path: str) -> bytes:
    with open_file(path, "rb") as f:
        return f.read()


# Ranged reads this process has sent to object stores through pread, read_range and
# read_ranges (the random-access paths), and the bytes they asked for, for the benchmarks'
# request counts.
ranged_reads = 0
ranged_bytes = 0


def pread(handle, path: str, start: int, length: int) -> bytes:
    """`length` bytes from `start` of the file `handle` (opened unbuffered on `path`), without
    moving its position: safe from several threads at once."""
    global ranged_reads, ranged_bytes
    if is_remote(path):
        ranged_reads += 1
        ranged_bytes += length
        with calling_store(path):
            return handle.read_at(length, start)
    return os.pread(handle.fileno(), length, start)


def read_range(path: str, start: int, length: int) -> bytes:
    """`length` bytes of `path` from `start`: one ranged read on an object store."""
    with open_file(path, "rb", buffered=False) as f:
        return pread(f, path, start, length)


# On an object store two ranges closer than this are fetched as one request, and no request
# grows past REMOTE_SPAN_BYTES (pyarrow's own read coalescing has the same two limits).
REMOTE_HOLE_BYTES = 128 << 10
REMOTE_SPAN_BYTES = 8 << 20
# REMOTE_READERS (object_stores): ranged reads of one file in flight at once.


def read_ranges(path: str, ranges: Sequence[tuple[int, int]], handle=None) -> list[bytes]:
    """The bytes of each (start, length) range of `path`, in the order given. On an object
    store, ranges less than REMOTE_HOLE_BYTES apart are fetched as one request and the
    requests run concurrently; on a disk each range is one positional read. `handle`: the
    file already open unbuffered (`open_file(path, "rb", buffered=False)`), which spares a
    metadata request on a store."""
    if not ranges:
        return []
    order = sorted(range(len(ranges)), key=lambda i: ranges[i][0])
    hole = REMOTE_HOLE_BYTES if is_remote(path) else 0
    spans: list[list[int]] = []  # [start, end, first position in `order`, last + 1]
    for position, i in enumerate(order):
        start, length = ranges[i]
        if spans and start <= spans[-1][1] + hole and \
                start + length - spans[-1][0] <= max(REMOTE_SPAN_BYTES, length):
            spans[-1][1] = max(spans[-1][1], start + length)
            spans[-1][3] = position + 1
        else:
            spans.append([start, start + length, position, position + 1])
    global ranged_reads, ranged_bytes
    with contextlib.nullcontext(handle) if handle is not None else \
            open_file(path, "rb", buffered=False) as f:
        if is_remote(path):
            ranged_reads += len(spans)
            ranged_bytes += sum(end - start for start, end, _, _ in spans)
            if len(spans) == 1:
                fetched = [f.read_at(spans[0][1] - spans[0][0], spans[0][0])]
            else:
                with ThreadPoolExecutor(min(REMOTE_READERS, len(spans))) as pool:
                    fetched = list(pool.map(lambda s: f.read_at(s[1] - s[0], s[0]), spans))
        else:
            fetched = [os.pread(f.fileno(), s[1] - s[0], s[0]) for s in spans]
    out: list[bytes] = [b""] * len(ranges)
    for (span_start, _, first, last), data in zip(spans, fetched):
        view = memoryview(data)
        for i in order[first:last]:
            start, length = ranges[i]
            out[i] = bytes(view[start - span_start:start - span_start + length])
    return out


def append_range(source: str, start: int, length: int, out) -> None:
    """Appends `length` bytes of `source`, from offset `start`, to the open file `out`. Between
    two local files the kernel copies them (copy_file_range: no trip through Python's memory);
    otherwise, or where the filesystem refuses, they are read and written."""
    if not is_remote(source) and hasattr(os, "copy_file_range") and hasattr(out, "fileno"):
        out.flush()
        copied = 0
        try:
            with open(source, "rb") as f:
                while copied < length:
                    step = os.copy_file_range(f.fileno(), out.fileno(), length - copied,
                                              offset_src=start + copied)
                    if step == 0:
                        raise _short_range(source, start, length, copied)
                    copied += step
            return
        except OSError:
            if copied:  # part of the range is written: going on would duplicate it
                raise
    data = read_range(source, start, length)
    if len(data) != length:
        raise _short_range(source, start, length, len(data))
    out.write(data)


def _short_range(source: str, start: int, length: int, found: int) -> EOFError:
    return EOFError(f"{source}: {length} bytes asked for at offset {start}, only {found} there")


def read_text(path: str) -> str:
    with open_file(path, "r") as f:
        return f.read()


def write_text(path: str, text: str) -> None:
    with open_file(path, "w") as f:
        f.write(text)


def create_new(path: str) -> bool:
    """Creates an empty file; False when it was there already. Exclusive on a disk; on an
    object store a look and a write, so two writers racing within one request may both win
    (the fault hooks' use: one test process, attempts seconds apart)."""
    if not is_remote(path):
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return False
        return True
    if exists(path):
        return False
    write_bytes(path, b"")
    return True


def write_bytes(path: str, data: bytes) -> None:
    with open_file(path, "wb") as f:
        f.write(data)


def read_json(path: str) -> Optional[Any]:
    """The JSON document at `path`, or None when there is no such file."""
    if not exists(path):
        return None
    return json.loads(read_text(path))


def write_json(path: str, value: Any, indent: Optional[int] = 2) -> None:
    write_text(path, json.dumps(value, indent=indent, sort_keys=True))


# ---- folders ------------------------------------------------------------------------------

def exists(path: str) -> bool:
    if not is_remote(path):
        return os.path.exists(path)
    return file_info(path).type.name != "NotFound"


def isdir(path: str) -> bool:
    if not is_remote(path):
        return os.path.isdir(path)
    return file_info(path).type.name == "Directory"


def stat(path: str) -> tuple[int, int]:
    """(size in bytes, modification time in ns) of a file."""
    if not is_remote(path):
        found = os.stat(path)
        return found.st_size, found.st_mtime_ns
    info = file_info(path)
    if info.type.name == "NotFound":
        raise StorageError(path, "not found")
    return info.size or 0, info.mtime_ns or 0


def size(path: str) -> int:
    return os.path.getsize(path) if not is_remote(path) else stat(path)[0]


def listdir(path: str) -> list[str]:
    if not is_remote(path):
        return sorted(os.listdir(path))
    return sorted({posixpath.basename(e.path.rstrip("/")) for e in entries(path, False)})


def walk(path: str) -> Iterator[tuple[str, list[str], list[str]]]:
    """(folder, subfolders, files) top-down, like os.walk; on a store from one listing."""
    if not is_remote(path):
        yield from os.walk(path)
        return
    top = path.rstrip("/")
    _, inner = filesystem(top)
    folders: dict[str, tuple[set[str], list[str]]] = {top: (set(), [])}

    def add_folder(relative: str) -> str:
        folder = posixpath.join(top, relative) if relative else top
        if folder not in folders:
            folders[folder] = (set(), [])
            parent = add_folder(posixpath.dirname(relative))
            folders[parent][0].add(posixpath.basename(relative))
        return folder

    for entry in entries(top, True):
        relative = entry.path[len(inner):].strip("/")
        if not relative:
            continue
        if entry.type.name == "Directory":
            add_folder(relative)
        else:
            folders[add_folder(posixpath.dirname(relative))][1].append(
                posixpath.basename(relative))
    for folder in sorted(folders):
        subfolders, files = folders[folder]
        yield folder, sorted(subfolders), sorted(files)


def glob(pattern: str) -> list[str]:
    """Files and folders matching a pattern; `*` and `?` do not cross `/`."""
    if not is_remote(pattern):
        return sorted(local_glob.glob(pattern))
    pieces = pattern.split("/")
    fixed = next((i for i, p in enumerate(pieces) if any(c in p for c in "*?[")), None)
    if fixed is None:
        return [pattern] if exists(pattern) else []
    top = "/".join(pieces[:fixed])
    depth = len(pieces) - fixed
    found = []
    for folder, subfolders, files in walk(top):
        level = len(parts(relpath(folder, top))) + 1
        if level > depth:
            continue
        for name in subfolders + files:
            candidate = posixpath.join(folder, name)
            if level == depth and _matches(candidate, pieces):
                found.append(candidate)
    return sorted(found)


def _matches(path: str, pieces: Sequence[str]) -> bool:
    names = path.split("/")
    return len(names) == len(pieces) and all(
        fnmatch.fnmatchcase(n, p) for n, p in zip(names, pieces))


def _local_or_store(path: str, local, method: str) -> None:
    """`local(path)` on a disk, else the pyarrow filesystem's `method` on the store."""
    if not is_remote(path):
        local(path)
        return
    store, inner = filesystem(path)
    with calling_store(path):
        getattr(store, method)(inner)


def makedirs(path: str) -> None:
    _local_or_store(path, functools.partial(os.makedirs, exist_ok=True), "create_dir")


def remove(path: str) -> None:
    _local_or_store(path, os.remove, "delete_file")


def rmtree(path: str) -> None:
    _local_or_store(path, shutil.rmtree, "delete_dir")


def rename(source: str, destination: str) -> None:
    """Moves a file or folder. Locally one atomic rename; on an object store each object is
    copied and deleted under its exact name (never a prefix), a folder's data first."""
    if not is_remote(source):
        os.rename(source, destination)
        return
    store, inner = filesystem(source)
    _, target = filesystem(destination)
    with calling_store(source):
        if not isdir(source):
            store.move(inner, target)
            return
        for folder, _, files in walk(source):
            for name in files:
                relative = relpath(posixpath.join(folder, name), source)
                store.move(posixpath.join(inner, relative), posixpath.join(target, relative))
        # A folder whose files were written without a marker object ends with its last file.
        if store.get_file_info(inner).type.name == "Directory":
            store.delete_dir(inner)


def copy_file(source: str, destination: str) -> None:
    if not is_remote(source) and not is_remote(destination):
        shutil.copyfile(source, destination)
        return
    if scheme(source) == scheme(destination):
        store, inner = filesystem(source)
        _, target = filesystem(destination)
        with calling_store(source):
            store.copy_file(inner, target)  # on a store, a copy inside the store
        return
    write_bytes(destination, read_bytes(source))


def copy_tree(source: str, destination: str) -> None:
    """Copies every file below `source` to the same place below `destination`."""
    for root, _, names in walk(source):
        target = join(destination, relpath(root, source)) if root.rstrip("/") != \
            source.rstrip("/") else destination
        makedirs(target)
        for name in names:
            copy_file(join(root, name), join(target, name))
