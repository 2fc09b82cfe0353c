"""The object stores behind `fileio`'s URIs: which pyarrow filesystem (or store client) serves
a URI, where it finds the store and its credentials, and a store's errors as `StorageError`.

Where a store is found, from the standard variables:
- gs://: Google's default credentials (`GOOGLE_APPLICATION_CREDENTIALS`, the metadata server
  on Vertex and GKE); `STORAGE_EMULATOR_HOST` (`http://host:port`) points at an emulator.
- s3://: `AWS_ENDPOINT_URL_S3` or `AWS_ENDPOINT_URL` (MinIO, Ceph, an emulator),
  `AWS_REGION` or `AWS_DEFAULT_REGION`, and the AWS SDK's credential chain
  (`AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`, profiles, instance roles).
- minio://: open-source Kubeflow Pipelines' name for its in-cluster MinIO (its default
  pipeline root, `minio://mlpipeline/v2/artifacts`): the same objects as s3://, at the
  endpoint the s3:// variables name.

Callers go through `fileio`, which re-exports what they use of this module.
"""
from __future__ import annotations

import contextlib
import functools
import io
import os
import re
from typing import Any, Iterator, Optional


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

REMOTE_READERS = 16  # ranged reads of one file in flight at once


# ---- where the stores are -----------------------------------------------------------------

def storage_settings() -> dict[str, str]:
    """The variables that say where the object stores are, as set in this process: what a
    child process (a Beam worker, a Spark executor, a container) needs to reach the same."""
    names = ("STORAGE_EMULATOR_HOST", "GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT",
             "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION",
             "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE")
    return {n: os.environ[n] for n in names if os.environ.get(n)}


def settings_key() -> tuple:
    """`storage_settings` as a key for the clients made once per settings."""
    return tuple(sorted(storage_settings().items()))


def s3_endpoint() -> Optional[str]:
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None


def s3_region() -> str:
    return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"


def split_endpoint(endpoint: str) -> tuple[str, str]:
    """('http' or 'https', 'host:port') of an endpoint URL; a bare host:port is http."""
    if "://" in endpoint:
        transport, rest = endpoint.split("://", 1)
        return transport, rest.rstrip("/")
    return "http", endpoint.rstrip("/")


# ---- the filesystems and clients ----------------------------------------------------------

def filesystem(uri: str):
    """(pyarrow filesystem, path inside it) for a URI."""
    store = scheme(uri)
    store = S3_ALIASES.get(store, store)
    inner = uri.split("://", 1)[1]
    inner = inner.rstrip("/") or inner
    try:
        return _store(store, settings_key()), inner
    except (OSError, ValueError, ImportError) as e:
        raise StorageError(uri, f"no filesystem for {store}:// in this pyarrow", str(e)) from e


@functools.lru_cache(maxsize=None)
def _store(store: str, settings: tuple):
    """One pyarrow filesystem per scheme and settings (made once: each holds a connection
    pool and, for GCS, a credential refresh)."""
    import pyarrow.fs as pafs  # pyarrow.fs: 0.1 s to import; only a URI needs it

    env = dict(settings)
    if store == "gs":
        emulator = env.get("STORAGE_EMULATOR_HOST")
        if emulator:
            transport, host = split_endpoint(emulator)
            return pafs.GcsFileSystem(anonymous=True, scheme=transport,
                                      endpoint_override=host)
        return pafs.GcsFileSystem()
    if store == "file":
        return pafs.LocalFileSystem()
    if store == "s3":
        endpoint = s3_endpoint()
        options: dict[str, Any] = {"region": s3_region()}
        if endpoint:
            transport, host = split_endpoint(endpoint)
            options.update(scheme=transport, endpoint_override=host)
        return pafs.S3FileSystem(**options)
    filesystem_, _ = pafs.FileSystem.from_uri(f"{store}://")
    return filesystem_


def gcs_client():
    """google-cloud-storage's client for this process's settings (gs:// ranged reads and
    listings of generations), made once."""
    return _gcs_client(settings_key())


@functools.lru_cache(maxsize=None)
def _gcs_client(settings: tuple):
    # google-cloud-storage: 0.3 s to import; only gs:// ranged reads and listings need it
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
    return gcs_client().bucket(bucket).blob(name)


# A forked child (a DataLoader worker, a Beam worker) makes its own connections: the parent's
# filesystem objects hold threads and sockets that do not survive a fork.
os.register_at_fork(after_in_child=lambda: (_store.cache_clear(), _gcs_client.cache_clear()))


# ---- a store's errors ---------------------------------------------------------------------

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


# ---- asking a store -----------------------------------------------------------------------

def file_info(uri: str):
    """pyarrow's FileInfo of a URI (its `type.name`: "File", "Directory" or "NotFound")."""
    store, inner = filesystem(uri)
    with calling_store(uri):
        return store.get_file_info(inner)


def entries(path: str, recursive: bool) -> list:
    """pyarrow's FileInfo of each entry below the URI `path` (none when it is not there)."""
    import pyarrow.fs as pafs  # pyarrow.fs: 0.1 s to import; only a URI needs it

    store, inner = filesystem(path)
    with calling_store(path):
        return store.get_file_info(pafs.FileSelector(inner, allow_not_found=True,
                                                     recursive=recursive))


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
