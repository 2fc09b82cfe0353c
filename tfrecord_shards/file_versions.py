"""What tells one content of a file from another without reading it (`FileVersion`): a local
file's modification time, a GCS object's generation, an S3 object's ETag, each listed from
the store's own client where pyarrow's listing lacks it. Callers go through `fileio`, which
re-exports `FileVersion`, `file_versions` and `versions_below`."""
from __future__ import annotations

import datetime
import functools
import os
from typing import Iterator, NamedTuple, Sequence

from tfrecord_shards.object_stores import (calling_store, entries, filesystem, gcs_client,
                                           is_remote, s3_endpoint, s3_region, scheme,
                                           settings_key, split_endpoint)


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
    """Every file below `folder` (as `fileio.walk` lists them) with its version
    (`file_versions`); on a store from one listing."""
    if not is_remote(folder):
        return file_versions([os.path.join(root, name) for root, _, names in os.walk(folder)
                              for name in names])
    top = folder.rstrip("/")
    lister = _lister(scheme(top))
    if lister is None:
        _, inner = filesystem(top)
        return {f"{top}/{entry.path[len(inner):].strip('/')}": _arrow_version(entry)
                for entry in entries(top, True) if entry.type.name == "File"}
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
    since = moment - datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
    return since // datetime.timedelta(microseconds=1) * 1000


def _gcs_versions(bucket: str, prefix: str) -> Iterator[tuple[str, FileVersion]]:
    with calling_store(f"gs://{bucket}/{prefix}"):
        client = gcs_client()
        for blob in client.list_blobs(
                bucket, prefix=prefix,
                fields="items(name,size,generation,timeCreated),nextPageToken"):
            # A new generation is a new object, so its creation time is when it was written.
            written = _epoch_ns(blob.time_created) if blob.time_created else 0
            yield blob.name, FileVersion(int(blob.size or 0), str(blob.generation), written)


@functools.lru_cache(maxsize=None)
def _s3_client(settings: tuple):
    import boto3  # boto3: 0.1 s to import, and only s3:// version listings need it

    endpoint = s3_endpoint()
    if endpoint:
        endpoint = "://".join(split_endpoint(endpoint))
    return boto3.client("s3", endpoint_url=endpoint, region_name=s3_region())


# A forked child (a DataLoader worker, a Beam worker) makes its own connections.
os.register_at_fork(after_in_child=_s3_client.cache_clear)


def _s3_versions(bucket: str, prefix: str) -> Iterator[tuple[str, FileVersion]]:
    with calling_store(f"s3://{bucket}/{prefix}"):
        client = _s3_client(settings_key())
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
            # boto3: 0.1 s to import; asked only whether it is there, on an s3:// version
            import boto3  # noqa: F401
        except ImportError:  # a test dependency, not the image's (constraints.txt: dev-only)
            return None
        return _s3_versions
    return {"gs": _gcs_versions}.get(store)
