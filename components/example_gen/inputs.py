"""The files a run reads, settled before it starts, as stock ExampleGen's driver settles its
input_config: TFX's span and version specs, span ranges, and pre-split inputs. Stock's
utilities (and so TFX) are imported only when a source has specs or pre-split patterns."""
from __future__ import annotations

import dataclasses

from components import fileio
from typing import Optional

from components.example_gen.options import ExampleGenOptions

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
    replaced source never comes from the cache. A local run settles them when its pipeline
    is built, just before it runs; a compiled pipeline's first task settles them each time
    it runs (`pipeline/example_gen_driver.py`), as stock ExampleGen's driver does."""
    from components.example_gen.sources import locate

    options = resolve_inputs(options)
    if options.source_fingerprint is None:
        options = dataclasses.replace(
            options, source_fingerprint=locate.source_fingerprint(options.source))
    return options


def needs_resolving(options: ExampleGenOptions) -> bool:
    """Whether `options` name patterns still to resolve (and are not resolved yet)."""
    return not options.resolved_inputs and (
        bool(options.input_config) or any(spec in options.source for spec in SPAN_SPECS))
