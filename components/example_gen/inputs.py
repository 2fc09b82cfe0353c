"""The files a run reads, settled before it starts, as stock ExampleGen's driver settles its
input_config: TFX's span and version specs, span ranges, and pre-split inputs. Stock's
utilities (and so TFX) are imported only when a source has specs or pre-split patterns."""
from __future__ import annotations

import contextlib
import dataclasses
import re
from typing import Iterator, Optional

from tfrecord_shards import fileio
from components.example_gen.options import ExampleGenOptions
from components.example_gen.sources import locate
from components.example_gen.sources.base import SourceError

# TFX's specs in a source pattern ({SPAN} and {VERSION} may carry a width: {SPAN:2}).
SPAN_SPECS = ("{SPAN", "{VERSION", "{YYYY}", "{MM}", "{DD}")
HASH_SPLITS = ""  # resolved_inputs' key for files whose rows are hash-split


def resolve_inputs(options: ExampleGenOptions) -> ExampleGenOptions:
    """The files a run reads, settled when the pipeline is built, as stock ExampleGen's driver
    settles its input_config: TFX's `{SPAN}`, `{YYYY}{MM}{DD}` and `{VERSION}` specs resolved
    with stock's utilities to the latest span and its latest version, or to each span of
    `range_config` (static, or rolling over the latest N), and pre-split inputs
    (`input_config`) to their patterns. The options then carry the resolved patterns, the spans,
    the last span and its version, and stock's fingerprint of the files, so a run whose
    inputs were already processed is reused from the cache."""
    # tfx: 9.8 s to import, and ExampleGen's engines import no TFX; only span specs need it.
    from tfx.components.example_gen import utils
    from tfx.proto import example_gen_pb2, range_config_pb2

    if options.input_config:
        base, patterns = options.source, dict(options.input_config)
    else:
        found = [i for i in (options.source.find(spec) for spec in SPAN_SPECS) if i >= 0]
        if not found:
            if options.range_config:
                raise ValueError(f"{options.source}: range_config needs a {{SPAN}} or "
                                 "{YYYY}{MM}{DD} spec in the source pattern")
            return options
        # Stock globs below a base folder; the base is what comes before the first spec.
        base = fileio.dirname(options.source[:min(found)])
        patterns = {HASH_SPLITS: fileio.relpath(options.source, base)}
    described = ", ".join(fileio.join(base, p) for p in patterns.values())

    def resolve(span: Optional[int] = None) -> tuple[int, Optional[int], str, dict]:
        splits = [example_gen_pb2.Input.Split(name=name or "source", pattern=pattern)
                  for name, pattern in patterns.items()]
        config = range_config_pb2.RangeConfig(static_range=range_config_pb2.StaticRange(
            start_span_number=span, end_span_number=span)) if span is not None else None
        fingerprint, found_span, version = \
            utils.calculate_splits_fingerprint_span_and_version(base, splits, config)
        return found_span, version, fingerprint, {
            name: fileio.join(base, split.pattern) for name, split in zip(patterns, splits)}

    try:
        latest = resolve()
    except ValueError as error:
        raise ValueError(f"{described}: {error}") from None
    has_spans = any(spec in p for p in patterns.values() for spec in SPAN_SPECS)
    spans = [latest[0]]
    if options.range_config and has_spans:
        ((kind, numbers),) = options.range_config.items()
        if kind == "static_range":
            spans = list(range(numbers["start_span_number"], numbers["end_span_number"] + 1))
        else:
            first = max(latest[0] - numbers.get("num_spans", 1) + 1,
                        numbers.get("start_span_number", 0))
            spans = list(range(first, latest[0] + 1))
    resolved, missing = [], []
    for span in spans:
        try:
            resolved.append(latest if span == latest[0] else resolve(span))
        except ValueError:
            missing.append(span)
    if missing or not resolved:
        raise ValueError(f"{described}: no files for span(s) {missing or spans} of the range "
                         f"{spans[0]}-{spans[-1]}")
    inputs = {name: [paths[name] for _, _, _, paths in resolved] for name in patterns}
    span, version = resolved[-1][0], resolved[-1][1]
    fingerprint = "\n".join(f for _, _, f, _ in resolved)
    if not options.input_config and len(resolved) == 1:
        # One span of one pattern: read as a plain source.
        return dataclasses.replace(options, source=inputs[HASH_SPLITS][0], span=span,
                                   version=version, source_fingerprint=fingerprint)
    spans = [s for s, _, _, _ in resolved] if has_spans else None
    return dataclasses.replace(options, resolved_inputs=inputs, span=span, version=version,
                               resolved_spans=spans, source_fingerprint=fingerprint)


def settle_inputs(options: ExampleGenOptions) -> ExampleGenOptions:
    """What a run of `options` reads, settled now: the spans and patterns resolved
    (`resolve_inputs`) and a fingerprint of the files (`locate.source_fingerprint`), so a
    replaced source never comes from the cache and ExampleGen can check that it reads what
    was fingerprinted (`unchanged_source`). A local run settles them when its pipeline is
    built, just before it runs; a compiled pipeline's first task settles them each time it
    runs (`pipeline/run_settings.py`), as stock ExampleGen's driver does. Resolved spans keep
    stock's fingerprint (the Examples artifact records it), ours on the line after it."""
    options = resolve_inputs(options)
    ours = locate.source_fingerprint(*[pattern for _, pattern in options.input_patterns()])
    fingerprint = "\n".join(filter(None, [stock_fingerprint(options.source_fingerprint),
                                          ours]))
    return dataclasses.replace(options, source_fingerprint=fingerprint or None)


# `locate.fingerprint`'s form: 16 hex digits of digest, "@", the newest file's time in ns.
OWN_FINGERPRINT = re.compile(r"^([0-9a-f]{16})@(\d+)$")


def stock_fingerprint(fingerprint: Optional[str]) -> Optional[str]:
    """The lines of `fingerprint` that stock's utilities computed (a resolved span's), or
    None."""
    lines = [line for line in (fingerprint or "").splitlines() if line.startswith("split:")]
    return "\n".join(lines) or None


def own_fingerprint(fingerprint: Optional[str]) -> Optional[str]:
    """The line of `fingerprint` that `locate.fingerprint` computed, or None (a bundled
    source's, or options nobody settled, as the `tfrp examplegen` command's)."""
    lines = (fingerprint or "").splitlines()
    return lines[-1] if lines and OWN_FINGERPRINT.match(lines[-1]) else None


@contextlib.contextmanager
def unchanged_source(options: ExampleGenOptions) -> Iterator[None]:
    """Around a run's reading of its source: the files are checked against the fingerprint
    settled for the run before anything is read, and again when all is read, so the run stops
    before it commits an output if a file changed in between, with one line naming the file
    (or the source, for a file removed before the read). Without a fingerprint of ours it
    checks nothing."""
    settled = own_fingerprint(options.source_fingerprint)
    if settled is None:
        yield
        return
    patterns = [pattern for _, pattern in options.input_patterns()]
    before = locate.source_versions(patterns)
    if locate.fingerprint(before) != settled:
        newest = int(OWN_FINGERPRINT.match(settled).group(2))
        written = sorted(path for path, version in before.items()
                         if version.written_ns > newest)
        if written:
            raise _changed(written[0], "changed after the run took its fingerprint")
        raise _changed(options.source, "a file was removed, or replaced by one with an "
                                       "older time, after the run took its fingerprint")
    yield
    after = fileio.file_versions(sorted(before))
    for path in sorted(before):
        if path not in after:
            raise _changed(path, "removed while the run read it")
        if after[path] != before[path]:
            raise _changed(path, "changed while the run read it")


def _changed(path: str, how: str) -> SourceError:
    return SourceError(f"{path}: the source changed during the run ({how}); no output was "
                       "committed: run again to read the source as it is now")


def needs_resolving(options: ExampleGenOptions) -> bool:
    """Whether `options` name patterns still to resolve (and are not resolved yet)."""
    return not options.resolved_inputs and (
        bool(options.input_config) or any(spec in options.source for spec in SPAN_SPECS))
