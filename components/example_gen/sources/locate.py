"""Where source files are: bundled names resolved, formats detected, files listed and
fingerprinted."""
from __future__ import annotations

import hashlib
import importlib.util
import posixpath
from typing import Optional, Sequence

from tfrecord_shards import fileio
from tfrecord_shards.codec.schema_file import SCHEMA_FILE
from tfrecord_shards.record_index import INDEX_FOLDER
from tfrecord_shards.shards import MANIFEST_FILE, QUARANTINE_DIR
from components.example_gen.sources.base import SourceError
from components.example_gen.sources.registry import FORMATS

# Data that ships inside an installed package, named rather than pathed so that a compiled
# pipeline finds it wherever the package is installed (a laptop's venv, the container image).
BUNDLED_PREFIX = "bundled:"
BUNDLED_SOURCES = {
    "taxi": ("tfx", "examples/chicago_taxi_pipeline/data/simple/data.csv"),
}
TAXI_SOURCE = BUNDLED_PREFIX + "taxi"


def resolve_source(source: str) -> str:
    """A path for `source`: itself, or where a `bundled:<name>` file is installed here."""
    if not source.startswith(BUNDLED_PREFIX):
        return source
    name = source[len(BUNDLED_PREFIX):]
    if name not in BUNDLED_SOURCES:
        raise SourceError(f"{source}: unknown bundled source; known: "
                          f"{', '.join(BUNDLED_PREFIX + n for n in BUNDLED_SOURCES)}")
    package, relative = BUNDLED_SOURCES[name]
    # find_spec locates the package without importing it (importing tfx is slow).
    # A namespace package (tfx's own wheel without ml-pipelines-sdk) has folders, no origin.
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise SourceError(f"{source}: the {package} package that holds it is not installed "
                          f"here; pass the file's path instead")
    paths = [fileio.join(folder, relative) for folder in spec.submodule_search_locations]
    for path in paths:
        if fileio.exists(path):
            return path
    raise SourceError(f"{source}: {paths[0]} is missing from the installed {package} package")


def source_versions(sources: Sequence[str]) -> dict[str, fileio.FileVersion]:
    """The files a fingerprint of `sources` covers, each with its version
    (`fileio.FileVersion`): below a folder every file (an image folder's images are data
    too), else the files a path or glob names."""
    versions: dict[str, fileio.FileVersion] = {}
    for source in sources:
        if fileio.isdir(source):
            versions.update(fileio.versions_below(source))
        else:
            versions.update(fileio.file_versions(list_files(source)))
    return versions


def fingerprint(versions: dict[str, fileio.FileVersion]) -> str:
    """`<digest>@<newest>`: a digest of each file's path, size and version, and when the
    newest of them was written. Unchanged files give the same fingerprint at every run, and
    a file written after it was taken is known by its time."""
    digest = hashlib.sha256()
    for path in sorted(versions):
        size, version, _ = versions[path]
        digest.update(f"{path}:{size}:{version}\n".encode())
    newest = max((v.written_ns for v in versions.values()), default=0)
    return f"{digest.hexdigest()[:16]}@{newest}"


def source_fingerprint(*sources: str) -> Optional[str]:
    """The `fingerprint` of the files under `sources` (sizes and modification times on a
    disk, generations on gs://, ETags on s3://), or None for a bundled source, which changes
    only with the installed package. It is a parameter of ExampleGen, so a changed file makes
    ExampleGen run again rather than come from the cache, and ExampleGen checks that what it
    reads still has it (`inputs.unchanged_source`)."""
    if any(source.startswith(BUNDLED_PREFIX) for source in sources):
        return None
    try:
        return fingerprint(source_versions(sources))
    except SourceError:
        return None  # the executor reports the missing source with its own message


def detect_format(path: str) -> str:
    """The format of a file or folder, from its extension(s) or a format's marker file (an
    image folder's labels.csv)."""
    # A file, a glob (the files it matches) or a folder (the files below it).
    files = list_files(path) if fileio.isdir(path) or any(c in path for c in "*?[") \
        else [path]
    if fileio.isdir(path):
        for source_format in FORMATS.values():
            marker = source_format.folder_marker
            if marker and fileio.exists(fileio.join(path, marker)):
                return source_format.name
    exts = {_extension(f) for f in files}
    if not exts:
        raise SourceError(f"{path}: no source files found")
    if len(exts) > 1:
        raise SourceError(f"{path}: mixed file types {sorted(exts)}; pass --format")
    ext = exts.pop()
    for source_format in FORMATS.values():
        if ext in source_format.extensions:
            return source_format.name
    raise SourceError(f"{path}: cannot tell the format of '{ext}' files; pass --format")


def _extension(path: str) -> str:
    name = fileio.basename(path).lower()
    if name.endswith(".gz"):
        name = name[:-3]
    if "data_tfrecord-" in name:  # TFX's own shard names carry no extension
        return ".tfrecord"
    return posixpath.splitext(name)[1]


def is_hidden(name: str) -> bool:
    """Names starting with "." or "_" (.crc checksums, _SUCCESS markers, editors' swap files)
    are bookkeeping of the tools that wrote a folder, not data."""
    return name.startswith((".", "_"))


def is_layout_file(root: str, name: str, output_roots: set[str]) -> bool:
    """A schema.pbtxt, or the manifest.json, quarantine/ and record indexes (index/, at the
    top or beside a partition's splits) of one of our own output folders read back as a
    source: they describe the shards beside them and are not data."""
    if name == SCHEMA_FILE:
        return True
    return any(root == top and name == MANIFEST_FILE or
               root == fileio.join(top, QUARANTINE_DIR) or
               root.startswith(top) and
               INDEX_FOLDER in fileio.parts(fileio.relpath(root, top))
               for top in output_roots)


def _output_roots(path: str) -> set[str]:
    return {root for root, _, names in fileio.walk(path) if MANIFEST_FILE in names}


def layout_files(path: str) -> list[str]:
    """The layout files (`is_layout_file`) below a source folder, which `list_files` leaves
    out; ExampleGen names them in its manifest."""
    if not fileio.isdir(path):
        return []
    roots = _output_roots(path)
    return sorted(fileio.join(root, n) for root, _, names in fileio.walk(path)
                  for n in names if not is_hidden(n) and is_layout_file(root, n, roots))


def hidden_files(path: str) -> list[str]:
    """The hidden files below a source folder, which `list_files` leaves out; ExampleGen
    names them in its manifest, so nothing is skipped unseen."""
    if not fileio.isdir(path):
        return []
    return sorted(fileio.join(root, n) for root, _, names in fileio.walk(path)
                  for n in names if is_hidden(n))


def list_files(path: str, fmt: Optional[str] = None) -> list[str]:
    """Source files under `path`, sorted, TFX's Split-* nesting included. Hidden files
    (`is_hidden`) and layout files (`is_layout_file`) are left out; `hidden_files` and
    `layout_files` list them for the manifest."""
    marker = FORMATS[fmt].folder_marker if fmt in FORMATS else None
    if marker:
        return [fileio.join(path, marker)]
    if not fileio.isdir(path):
        matched = sorted(fileio.glob(path))
        if not matched:
            raise SourceError(f"{path}: no such file")
        return matched
    found = []
    roots = _output_roots(path)
    for root, _, names in fileio.walk(path):
        found += [fileio.join(root, n) for n in names
                  if not is_hidden(n) and not is_layout_file(root, n, roots)]
    return sorted(found)


def taxi_csv_path() -> str:
    """The Chicago taxi sample (15,002 trips) bundled in the tfx wheel."""
    return resolve_source(TAXI_SOURCE)


def input_files(inputs: list[tuple[Optional[str], str]], fmt: str
                ) -> tuple[str, list[str], list[Optional[str]]]:
    """(format, files, each file's split) of a run's inputs, (split, pattern) pairs as
    `ExampleGenOptions.input_patterns` gives them; a split of None means hash-split rows."""
    files, file_splits = [], []
    for split, pattern in inputs:
        _, fmt_found, found = source_files(pattern, fmt)
        fmt = fmt_found
        files += found
        file_splits += [split] * len(found)
    return fmt, files, file_splits


def unread_files(inputs: list[tuple[Optional[str], str]]) -> tuple[list[str], list[str]]:
    """(hidden files, layout files) below the inputs' folders, which a run leaves out and
    names in its manifest."""
    folders = [resolve_source(pattern) for _, pattern in inputs]
    return ([f for folder in folders for f in hidden_files(folder)],
            [f for folder in folders for f in layout_files(folder)])


def source_files(source: str, fmt: str) -> tuple[str, str, list[str]]:
    """(resolved source, format, files) of a run, checked: a known format, at least one file."""
    source = resolve_source(source)
    fmt = detect_format(source) if fmt == "auto" else fmt
    if fmt not in FORMATS:
        raise ValueError(f"--format must be one of {tuple(FORMATS)} or auto, not {fmt!r}")
    files = list_files(source, fmt)
    if not files:
        raise SourceError(f"{source}: no source files")
    return source, fmt, files
