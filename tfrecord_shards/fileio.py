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

Where a store is found, from the standard variables:
- gs://: Google's default credentials (`GOOGLE_APPLICATION_CREDENTIALS`, the metadata server
  on Vertex and GKE); `STORAGE_EMULATOR_HOST` (`http://host:port`) points at an emulator.
- s3://: `AWS_ENDPOINT_URL_S3` or `AWS_ENDPOINT_URL` (MinIO, Ceph, an emulator),
  `AWS_REGION` or `AWS_DEFAULT_REGION`, and the AWS SDK's credential chain
  (`AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`, profiles, instance roles).
- minio://: open-source Kubeflow Pipelines' name for its in-cluster MinIO (its default
  pipeline root, `minio://mlpipeline/v2/artifacts`): the same objects as s3://, at the
  endpoint the s3:// variables name.
"""
from __future__ import annotations

import contextlib
import fnmatch
import functools
import io
import json
import os
import posixpath
import re
import shutil
from typing import Any, Iterator, NamedTuple, Optional, Sequence

# Names a reader of our outputs never lists: staging and bookkeeping (`.staging-*`,
# `_attempts`, `_chunks`, `.crc`, `_SUCCESS`).
HIDDEN_PREFIXES = (".", "_")


class StorageError(OSError):
    """An object store refused or could not be reached. One line: the URI and the cause."""

    def __init__(self, uri: str, cause: str, detail: str = ""):
        detail = " ".join(str(detail).split())
        if len(detail) > 400:  # the start says where, the end (google-cloud's) says why
            detail = f"{detail[:150]} ... {detail[-250:]}"
        super().__init__(f"{uri}: {cause}" + (f" ({detail})" if detail else ""))
        self.uri, self.cause = uri, cause


def is_remote(path: str) -> bool:
    """A URI, read through pyarrow.fs (file:// too: the same route on this machine's disk)."""
    return "://" in path


def scheme(path: str) -> str:
    return path.split("://", 1)[0] if is_remote(path) else ""


# Schemes that name S3 objects under another name (launcher_v2.go's LocalPathForURI mounts
# minio:// beside s3://).
S3_ALIASES = {"minio": "s3"}


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


# ---- the stores ---------------------------------------------------------------------------

def storage_settings() -> dict[str, str]:
    """The variables that say where the object stores are, as set in this process: what a
    child process (a Beam worker, a Spark executor, a container) needs to reach the same."""
    names = ("STORAGE_EMULATOR_HOST", "GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT",
             "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION",
             "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE")
    return {n: os.environ[n] for n in names if os.environ.get(n)}


def s3_endpoint() -> Optional[str]:
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None


def s3_region() -> str:
    return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"


def _split_endpoint(endpoint: str) -> tuple[str, str]:
    """('http' or 'https', 'host:port') of an endpoint URL; a bare host:port is http."""
    if "://" in endpoint:
        transport, rest = endpoint.split("://", 1)
        return transport, rest.rstrip("/")
    return "http", endpoint.rstrip("/")


def filesystem(uri: str):
    """(pyarrow filesystem, path inside it) for a URI."""
    store = scheme(uri)
    store = S3_ALIASES.get(store, store)
    inner = uri.split("://", 1)[1]
    inner = inner.rstrip("/") or inner
    try:
        return _store(store, tuple(sorted(storage_settings().items()))), inner
    except (OSError, ValueError, ImportError) as e:
        raise StorageError(uri, f"no filesystem for {store}:// in this pyarrow", str(e)) from e


@functools.lru_cache(maxsize=None)
def _store(store: str, settings: tuple):
    """One pyarrow filesystem per scheme and settings (made once: each holds a connection
    pool and, for GCS, a credential refresh)."""
    import pyarrow.fs as pafs

    env = dict(settings)
    if store == "gs":
        emulator = env.get("STORAGE_EMULATOR_HOST")
        if emulator:
            transport, host = _split_endpoint(emulator)
            return pafs.GcsFileSystem(anonymous=True, scheme=transport,
                                      endpoint_override=host)
        return pafs.GcsFileSystem()
    if store == "file":
        return pafs.LocalFileSystem()
    if store == "s3":
        endpoint = s3_endpoint()
        options: dict[str, Any] = {"region": s3_region()}
        if endpoint:
            transport, host = _split_endpoint(endpoint)
            options.update(scheme=transport, endpoint_override=host)
        return pafs.S3FileSystem(**options)
    filesystem_, _ = pafs.FileSystem.from_uri(f"{store}://")
    return filesystem_


# A forked child (a DataLoader worker, a Beam worker) makes its own connections: the parent's
# filesystem objects hold threads and sockets that do not survive a fork.
os.register_at_fork(after_in_child=lambda: (_store.cache_clear(), _gcs_client.cache_clear(),
                                             _s3_client.cache_clear()))

_CAUSES = (
    (re.compile(r"credential|UNAUTHENTICATED|Unauthorized|PERMISSION_DENIED|AccessDenied|Forbidden|"
                r"InvalidAccessKeyId|SignatureDoesNotMatch|ExpiredToken|HTTP status 40[13]", re.I),
     "no valid credentials or access denied: check the credentials "
     "(GOOGLE_APPLICATION_CREDENTIALS or the metadata server for gs://; "
     "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or a profile for s3://)"),
    (re.compile(r"resolve host|Couldn't connect|Connection refused|UNAVAILABLE|timed out|"
                r"Timeout|curlCode|network|Could not connect|connection", re.I),
     "cannot reach the store: check the endpoint (STORAGE_EMULATOR_HOST for a gs:// "
     "emulator; AWS_ENDPOINT_URL for MinIO or another S3 store) and the network"),
    (re.compile(r"NOT_FOUND|NotFound|NoSuchBucket|NoSuchKey|does not exist|Not Found|"
                r"HTTP status 404", re.I), "not found"),
)


def store_cause(detail: str) -> Optional[str]:
    """What a store's error says went wrong (credentials, endpoint, not found), or None when
    it names none of these (a damaged file's error, say)."""
    for pattern, cause in _CAUSES:
        if pattern.search(detail):
            return cause
    return None


def _cause(detail: str) -> str:
    return store_cause(detail) or "the store refused the request"


@contextlib.contextmanager
def calling_store(uri: str) -> Iterator[None]:
    """Turns a store's error into a StorageError naming `uri` and the cause."""
    try:
        yield
    except StorageError:
        raise
    except FileNotFoundError as e:
        raise StorageError(uri, "not found", str(e)) from e
    except OSError as e:
        raise StorageError(uri, _cause(str(e)), str(e)) from e
    except Exception as e:
        # google-cloud-storage's and google-auth's errors (gs:// ranged reads) are their own,
        # as are boto3's (s3:// listings of versions).
        if type(e).__module__.startswith(("google.", "botocore.")):
            raise StorageError(uri, _cause(f"{type(e).__name__} {e}"), str(e)) from e
        # pyarrow's GCS client reports a credential it cannot use (a broken key file) as
        # ArrowInvalid, a ValueError; a parse error of the data is one too, and stays one.
        cause = store_cause(str(e)) if type(e).__module__.startswith("pyarrow") else None
        if cause is not None:
            raise StorageError(uri, cause, str(e)) from e
        raise


def _info(uri: str):
    import pyarrow.fs as pafs

    store, inner = filesystem(uri)
    with calling_store(uri):
        return store.get_file_info(inner), pafs


# ---- reading and writing ------------------------------------------------------------------

# A read of a URI file is one request; reading ahead this much makes a stream of small reads
# (a record's header, then its body) a request per 4 MiB, not one per read.
REMOTE_READ_AHEAD = 4 << 20


class RemoteFile(io.RawIOBase):
    """A seekable, unbuffered read of a URI file in which every read is one request for
    exactly the bytes asked for (`read_at` also serves positional reads from threads).
    pyarrow 10's GCS file asks for everything from the position to the object's end and drops
    the rest, so on gs:// the range goes through google-cloud-storage instead."""

    def __init__(self, uri: str, size: int):
        super().__init__()
        self.uri, self.size, self._position = uri, size, 0
        if scheme(uri) == "gs":
            self._blob = _gcs_blob(uri)
            self._handle = None
        else:
            store, inner = filesystem(uri)
            self._handle = store.open_input_file(inner)

    def read_at(self, length: int, start: int) -> bytes:
        length = max(0, min(length, self.size - start))
        if not length:
            return b""
        with calling_store(self.uri):
            if self._handle is not None:
                return self._handle.read_at(length, start)
            return self._blob.download_as_bytes(start=start, end=start + length - 1,
                                                raw_download=True, checksum=None)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._position, 2: self.size}[whence]
        self._position = max(0, base + offset)
        return self._position

    def readinto(self, buffer) -> int:
        data = self.read_at(len(buffer), self._position)
        buffer[:len(data)] = data
        self._position += len(data)
        return len(data)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
        super().close()


@functools.lru_cache(maxsize=None)
def _gcs_client(settings: tuple):
    import requests.adapters
    from google.cloud import storage

    client = storage.Client()
    # requests keeps 10 connections a host; with more ranged reads in flight than that, the
    # rest would each open (and drop) a TLS connection of their own.
    pool = requests.adapters.HTTPAdapter(pool_maxsize=4 * REMOTE_READERS)
    for prefix in ("https://", "http://"):
        client._http.mount(prefix, pool)
    return client


def _gcs_blob(uri: str):
    bucket, _, name = uri.split("://", 1)[1].partition("/")
    return _gcs_client(tuple(sorted(storage_settings().items()))).bucket(bucket).blob(name)


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
REMOTE_READERS = 16  # ranged reads of one file in flight at once


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
                from concurrent.futures import ThreadPoolExecutor

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
    info, pafs = _info(path)
    return info.type != pafs.FileType.NotFound


def isdir(path: str) -> bool:
    if not is_remote(path):
        return os.path.isdir(path)
    info, pafs = _info(path)
    return info.type == pafs.FileType.Directory


def stat(path: str) -> tuple[int, int]:
    """(size in bytes, modification time in ns) of a file."""
    if not is_remote(path):
        found = os.stat(path)
        return found.st_size, found.st_mtime_ns
    info, pafs = _info(path)
    if info.type == pafs.FileType.NotFound:
        raise StorageError(path, "not found")
    return info.size or 0, info.mtime_ns or 0


def size(path: str) -> int:
    return os.path.getsize(path) if not is_remote(path) else stat(path)[0]


class FileVersion(NamedTuple):
    """What tells one content of a file from another without reading it: its size, the
    store's version (a local file's modification time in ns, a GCS object's generation, an
    S3 object's ETag) and when that version was written (ns since the epoch), which orders
    changes."""

    size: int
    version: str
    written_ns: int


def file_versions(paths: Sequence[str]) -> dict[str, FileVersion]:
    """Each of `paths` that exists, with its version. On gs:// and s3:// it comes from one
    listing a bucket (the store's own client: pyarrow 10's FileInfo has neither the
    generation nor the ETag, and a modification time alone misses a replacement within its
    resolution); elsewhere (and on s3:// without boto3, which the image leaves out) from each
    file's size and modification time."""
    found: dict[str, FileVersion] = {}
    in_buckets: dict[tuple[str, str], set[str]] = {}
    elsewhere: dict[str, list[str]] = {}
    for path in paths:
        if not is_remote(path):
            try:
                found[path] = _local_version(path)
            except FileNotFoundError:
                pass
        elif _lister(scheme(path)) is not None:
            bucket, _, key = path.split("://", 1)[1].partition("/")
            in_buckets.setdefault((scheme(path), bucket), set()).add(key)
        else:
            elsewhere.setdefault(scheme(path), []).append(path)
    for (store, bucket), keys in in_buckets.items():
        # One listing from the keys' common prefix: a folder's files share theirs.
        prefix = os.path.commonprefix(sorted(keys))
        for key, version in _lister(store)(bucket, prefix):
            if key in keys:
                found[f"{store}://{bucket}/{key}"] = version
    for uris in elsewhere.values():
        store, _ = filesystem(uris[0])
        with calling_store(uris[0]):
            infos = store.get_file_info([filesystem(uri)[1] for uri in uris])
        for uri, info in zip(uris, infos):
            if info.type.name == "File":
                found[uri] = _arrow_version(info)
    return found


def versions_below(folder: str) -> dict[str, FileVersion]:
    """Every file below `folder` (as `walk` lists them) with its version (`file_versions`);
    on a store from one listing."""
    if not is_remote(folder):
        return file_versions([join(root, name) for root, _, names in walk(folder)
                              for name in names])
    top = folder.rstrip("/")
    lister = _lister(scheme(top))
    if lister is None:
        _, inner = filesystem(top)
        return {f"{top}/{entry.path[len(inner):].strip('/')}": _arrow_version(entry)
                for entry in _entries(top, True) if entry.type.name == "File"}
    bucket, _, key = top.split("://", 1)[1].partition("/")
    prefix = f"{key}/" if key else ""
    # A key ending in "/" is a folder's marker object, not a file (`walk` skips it too).
    return {f"{scheme(top)}://{bucket}/{name}": version
            for name, version in lister(bucket, prefix) if not name.endswith("/")}


def _local_version(path: str) -> FileVersion:
    found = os.stat(path)
    return FileVersion(found.st_size, str(found.st_mtime_ns), found.st_mtime_ns)


def _arrow_version(info) -> FileVersion:
    return FileVersion(info.size or 0, str(info.mtime_ns or 0), info.mtime_ns or 0)


def _epoch_ns(moment) -> int:
    """A timezone-aware datetime (the stores' clients give them) in ns since the epoch."""
    import datetime

    since = moment - datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
    return since // datetime.timedelta(microseconds=1) * 1000


def _gcs_versions(bucket: str, prefix: str) -> Iterator[tuple[str, FileVersion]]:
    with calling_store(f"gs://{bucket}/{prefix}"):
        client = _gcs_client(tuple(sorted(storage_settings().items())))
        for blob in client.list_blobs(
                bucket, prefix=prefix,
                fields="items(name,size,generation,timeCreated),nextPageToken"):
            # A new generation is a new object, so its creation time is when it was written.
            written = _epoch_ns(blob.time_created) if blob.time_created else 0
            yield blob.name, FileVersion(int(blob.size or 0), str(blob.generation), written)


@functools.lru_cache(maxsize=None)
def _s3_client(settings: tuple):
    import boto3

    endpoint = s3_endpoint()
    if endpoint:
        endpoint = "://".join(_split_endpoint(endpoint))
    return boto3.client("s3", endpoint_url=endpoint, region_name=s3_region())


def _s3_versions(bucket: str, prefix: str) -> Iterator[tuple[str, FileVersion]]:
    with calling_store(f"s3://{bucket}/{prefix}"):
        client = _s3_client(tuple(sorted(storage_settings().items())))
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket,
                                                                     Prefix=prefix):
            for item in page.get("Contents", []):
                yield item["Key"], FileVersion(item["Size"], item["ETag"].strip('"'),
                                               _epoch_ns(item["LastModified"]))


def _lister(store: str):
    """The listing of (key, version) pairs under a bucket's prefix that `store`'s own client
    gives, or None where pyarrow's sizes and times are all there is."""
    if store == "s3":
        try:
            import boto3  # noqa: F401
        except ImportError:  # a test dependency, not the image's (constraints.txt: dev-only)
            return None
        return _s3_versions
    return {"gs": _gcs_versions}.get(store)


def _entries(path: str, recursive: bool) -> list:
    import pyarrow.fs as pafs

    store, inner = filesystem(path)
    with calling_store(path):
        return store.get_file_info(pafs.FileSelector(inner, allow_not_found=True,
                                                     recursive=recursive))


def listdir(path: str) -> list[str]:
    if not is_remote(path):
        return sorted(os.listdir(path))
    return sorted({posixpath.basename(e.path.rstrip("/")) for e in _entries(path, False)})


def walk(path: str) -> Iterator[tuple[str, list[str], list[str]]]:
    """(folder, subfolders, files) top-down, like os.walk; on a store from one listing."""
    if not is_remote(path):
        yield from os.walk(path)
        return
    import pyarrow.fs as pafs

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

    for entry in _entries(top, True):
        relative = entry.path[len(inner):].strip("/")
        if not relative:
            continue
        if entry.type == pafs.FileType.Directory:
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
        import glob as local_glob

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
