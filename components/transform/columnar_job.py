"""ShardedTransform's columnar path: the statistics of a preprocessing_fn that takes them
through `analyzers.current()` (our schema-derived default, the taxi Transform) computed in one
vectorized pass, and the transform applied to large batches by the finished graph. It
imports no TFX; `beam_job.run` picks it (`TransformOptions.analysis`), and any other
preprocessing_fn keeps tf.Transform's general path.

1. Trace the preprocessing_fn once with `CollectAnalyzers`: a function from a batch of raw
   tensors to every analyzer's input (`AnalyzerInputs`).
2. Analyse (a Beam job, one element per piece of the analyze split: about `piece_records`
   records of one file, `input_pieces`, so one large file spreads too): decode each piece's
   records to Arrow with the codec's compiled decoder, make tensors as tf.Transform's own
   adapter makes them (`inputs.py`), run the function, add each batch to the numpy accumulators
   (`statistics.Analysis`); merge the pieces' analyses in a tree fixed by their order
   (`merged_in_file_order`: every runner the same constants), then the inputs' in their
   order. With an analyzer cache, each input's analysis is kept (by `inputs.dataset_key`
   and the function's fingerprint) and an input seen before is not read again. With
   `reuse_decoded` (the default), each piece's decoded batches are also written, in their
   compact form (`compact_batches`, two fifths of the bytes), as an Arrow IPC file in the
   run's staging folder (through the file layer, so on any runner and any store), for
   step 4. With a statistics plan, each batch is also summarised for the
   pre-transform statistics (a SplitStats a piece, merged by StatisticsGen's order-free
   `MergeSplitStats`).
3. Trace the preprocessing_fn again with `ConstantAnalyzers` and write it with tf.Transform's
   own writer (`impl_helper.trace_and_write_v2_saved_model`): a standard TransformGraph
   (`transform_fn/` with its vocabularies as assets, `transformed_metadata/`), which the
   stock Trainer, TFMA and TF Serving load as they load tf.Transform's.
4. Transform (a Beam job, one element per piece of every split, each piece's output in its
   place among them, so the rows keep the input's order): the graph from step 3
   applied to decoded batches of about 64k rows (of the analysed split, the batches step 2
   kept, read back instead of decoded again; the batches' tensors made on the reading
   thread, a batch or two ahead), its outputs converted to Arrow by
   tf.Transform's converter, then packed and written by the same encoder and sharding
   writer as the general path, on a thread of its own (`EncodingThread`) while the next
   batch is transformed; with a statistics plan, the converted rows are summarised
   for the post-transform statistics as in step 2.
"""
from __future__ import annotations

import hashlib
import json
import logging
from typing import Callable, Optional, Sequence, Union

import apache_beam as beam
import numpy as np
import tensorflow as tf
from tensorflow_metadata.proto.v0 import schema_pb2
import tensorflow_transform as tft
from tensorflow_transform import graph_context, impl_helper
from tensorflow_transform.saved import saved_transform_io_v2
from tensorflow_transform.tf_metadata import metadata_io
from tfx_bsl.tfxio import tensor_adapter

from tfrecord_shards import fileio, record_index, rows_done, shards, tfrecord_io
from tfrecord_shards.memory import release_free_memory
from components.statistics_gen.accumulators import SplitStats
from components.statistics_gen.beam_job import MergeSplitStats, SplitStatsCoder
from components.statistics_gen.options import StatisticsGenOptions
from components.statistics_gen.plan import Plan
from components.transform import analyzers
from components.transform.feature_stats import summarise
from components.transform.encoding import ROW_COUNTS, EncodingThread, SplitEncoder
from components.transform.inputs import (
    READ_AHEAD, RawTensorAdapter, analysis_key, dataset_key, kept_batches, read_ahead,
    record_batches, split_paths, tensor_adapter_config)
from components.transform.options import TransformOptions
from components.transform.preprocessing import load_preprocessing_fn
from components.transform.statistics import Analysis, AnalyzerSpec, merged

# What the analyzer cache's entries depend on besides the function: bump when the
# accumulators or the order of their merging change.
CACHE_VERSION = "columnar-4"
ANALYSIS_FILE = "columnar_analysis.pkl"
# The tagged output of the passes' DoFns that carries a file's statistics (a SplitStats).
STATISTICS = "statistics"
# Files' analyses merged at once (`merged_in_file_order`): a wide schema's analysis holds a
# quantiles sketch of up to 1.5 MB a feature (epsilon 0.001, compacted), so a group stays in
# the tens of MB.
MERGE_FAN_IN = 8


class AnalyzerInputs:
    """The preprocessing_fn traced once with `CollectAnalyzers`: `specs` (the statistics it
    asks for, in order) and `__call__`, a batch of raw tensors -> each analyzer's input."""

    def __init__(self, preprocessing_fn: Callable[[dict], dict], type_specs: dict):
        self.preprocessing_fn = preprocessing_fn
        collect = analyzers.CollectAnalyzers()

        def analyzer_inputs(inputs):
            # tf.Transform's own analyzers, where a user's function calls them, need a graph
            # context to trace in (without one they fail once another context has closed in
            # this process); they are then found below and the run takes the general path.
            with analyzers.using(collect), graph_context.TFGraphContext(tf.Module()):
                preprocessing_fn(dict(inputs))
            return {key: dict(parts) for key, parts in collect.inputs.items()}

        self._function = tf.function(analyzer_inputs, autograph=False).get_concrete_function(
            dict(type_specs))
        if analyzers.uses_tft_analyzers(self._function.graph):
            raise NotColumnar("the preprocessing_fn calls tf.Transform's analyzers itself")
        self.specs: list[AnalyzerSpec] = collect.specs

    def __call__(self, tensors: dict) -> dict[str, dict[str, np.ndarray]]:
        if not self.specs:
            return {}
        return {key: {name: value.numpy() for name, value in parts.items()}
                for key, parts in self._function(tensors).items()}

    def fingerprint(self) -> str:
        """Of the computation from raw tensors to the analyzers' inputs, and the statistics
        asked for: an analyzer cache entry is for these and no other. Only the ops the
        analyzers' inputs depend on count, each by what it is (type, attributes, inputs) and
        not by name, so a run whose schema changed nothing the analyzers read (a new string
        value in a domain, a missing-value flag added) finds the analysis of an input it has
        seen (a span of a rolling window)."""
        digest = hashlib.sha256(CACHE_VERSION.encode())
        digest.update(_subgraph_digest([tensor for parts in self._function.structured_outputs
                                        .values() for tensor in parts.values()]).encode())
        digest.update(repr(self.specs).encode())
        return digest.hexdigest()[:16]


def _subgraph_digest(outputs: list) -> str:
    """A digest of the ops `outputs` are computed from, each op named by the digest of its
    type, attributes and inputs (so names, which differ from trace to trace, do not count),
    visited without recursion."""
    digests: dict[str, str] = {}
    pending = [tensor.op for tensor in outputs]
    while pending:
        op = pending[-1]
        if op.name in digests:
            pending.pop()
            continue
        sources = [tensor.op for tensor in op.inputs] + list(op.control_inputs)
        waiting = [source for source in sources if source.name not in digests]
        if waiting:
            pending.extend(waiting)
            continue
        pending.pop()
        attributes = sorted((key, value.SerializeToString(deterministic=True))
                            for key, value in op.node_def.attr.items()
                            if not key.startswith("_"))
        node = (op.type, attributes,
                [f"{digests[t.op.name]}:{t.value_index}" for t in op.inputs],
                sorted(digests[c.name] for c in op.control_inputs))
        digests[op.name] = hashlib.sha256(repr(node).encode()).hexdigest()
    return hashlib.sha256(" ".join(f"{digests[t.op.name]}:{t.value_index}"
                                   for t in outputs).encode()).hexdigest()


class NotColumnar(ValueError):
    """The preprocessing_fn needs tf.Transform's general path."""


# Traced functions and loaded graphs, by what they were made from: a Beam worker in the
# process that planned the job (DirectRunner's default) reuses them instead of tracing the
# preprocessing_fn or loading the graph again, each costing seconds.
_traced: dict[tuple[str, bytes], AnalyzerInputs] = {}
_loaded: dict[str, tuple] = {}


def analyzer_inputs(options: TransformOptions, raw_schema: schema_pb2.Schema
                    ) -> AnalyzerInputs:
    """The run's preprocessing_fn traced for its analyzer inputs (raises NotColumnar when
    it calls tf.Transform's analyzers itself)."""
    key = (options.to_json(), raw_schema.SerializeToString(deterministic=True))
    if key not in _traced:
        specs = tensor_adapter.TensorAdapter(tensor_adapter_config(raw_schema)).TypeSpecs()
        _traced[key] = AnalyzerInputs(load_preprocessing_fn(options, raw_schema), specs)
    return _traced[key]


def columnar_inputs(options: TransformOptions, raw_schema: schema_pb2.Schema
                    ) -> Optional[AnalyzerInputs]:
    """The run's analyzer inputs when the columnar path can analyse its preprocessing_fn,
    else None (tf.Transform's general path)."""
    try:
        return analyzer_inputs(options, raw_schema)
    except NotColumnar as reason:
        logging.info("Transform takes tf.Transform's general path: %s", reason)
        return None


Piece = Union[str, tfrecord_io.RecordRange]  # a file, or a range of one


# {(an Examples folder, a split): its files cut into pieces}, worked out once a run
# (`input_pieces`) for both passes, which take the same pieces.
InputPieces = dict[tuple[str, str], list[Piece]]


def input_pieces(examples_dirs: Sequence[str], splits: Sequence[str], piece_records: int
                 ) -> InputPieces:
    """The files of each split of each of `examples_dirs`, in order, cut into pieces of
    about `piece_records` records (`record_index.pieces`): the passes' units of work, the
    same pieces every time for the same files and setting."""
    files = {(d, split): split_paths(d, split) for d in examples_dirs for split in splits}
    by_file: dict[str, list[Piece]] = {}
    # One call, so each manifest is read once for every split.
    every_file = list(dict.fromkeys(f for found in files.values() for f in found))
    for piece in record_index.pieces(every_file, piece_records):
        by_file.setdefault(piece if isinstance(piece, str) else piece.path, []).append(piece)
    return {key: [piece for f in found for piece in by_file[f]]
            for key, found in files.items()}


def pieces_of(pieces: InputPieces, examples_dirs: Sequence[str], split: str) -> list[Piece]:
    """`split`'s pieces of each of `examples_dirs`, in order."""
    return [piece for d in examples_dirs for piece in pieces[(d, split)]]


def kept_copy(keep_dir: str, piece: Piece) -> str:
    """Where the analysis keeps the decoded batches of `piece`, in `keep_dir`."""
    name = piece if isinstance(piece, str) else f"{piece.path}@{piece.start}-{piece.end}"
    return fileio.join(keep_dir, hashlib.sha256(name.encode()).hexdigest()[:24] + ".arrow")


def kept_copies(keep_dir: Optional[str], analysed: Sequence[Piece]) -> dict[Piece, str]:
    """{piece: its decoded copy in `keep_dir`} for the `analysed` pieces, whose analysis
    kept them there; none without `keep_dir`."""
    if not keep_dir:
        return {}
    return {piece: kept_copy(keep_dir, piece) for piece in analysed}


class _AnalyzeFile(beam.DoFn):
    """(place, a piece of the analyze split) -> (place, its `Analysis`). With `keep_dir`,
    the piece's decoded batches are also written there (`kept_copy`) for the transform to
    apply the graph to, so that it reads Arrow and does not decode the tf.Examples again.
    The copy goes through the file layer, beside the run's staging output, not into this
    worker's memory: on a distributed runner the transform of a piece may run on another
    worker."""

    def __init__(self, options: TransformOptions, raw_schema: schema_pb2.Schema,
                 keep_dir: Optional[str] = None, statistics_plan: Optional[Plan] = None):
        self._options, self._raw_schema = options, raw_schema
        self._keep_dir, self._statistics_plan = keep_dir, statistics_plan

    def setup(self):
        self._adapter = RawTensorAdapter(self._raw_schema)
        self._inputs = analyzer_inputs(self._options, self._raw_schema)

    def process(self, element: tuple[int, Piece]):
        place, piece = element
        analysis = Analysis(self._inputs.specs)
        stats = file_statistics(self._statistics_plan)
        keep = kept_copy(self._keep_dir, piece) if self._keep_dir else None
        for batch in record_batches(piece, self._raw_schema, keep):
            analysis.add(batch.num_rows, self._inputs(self._adapter.to_tensors(batch)))
            if stats:
                summarise(stats, batch)
        yield place, analysis.compact().to_bytes()
        release_free_memory()
        if stats:
            yield beam.pvalue.TaggedOutput(STATISTICS, stats.compact())


def merged_in_file_order(pipeline, analyses, specs: list[AnalyzerSpec], files: int,
                         name: str):
    """The pieces' (place, analysis bytes) -> one analysis (bytes) of them all, merged in a
    tree fixed by the number of pieces (`files`): groups of MERGE_FAN_IN neighbours, each
    merged in file order, then the groups' results the same way. A quantiles sketch's merge
    and a float sum depend on the order of merging, which a CombineFn leaves to the runner,
    so this gives every runner (one process or many workers) the same constants in the
    graph."""
    if not files:
        return pipeline | f"NoFiles[{name}]" >> beam.Create([Analysis(specs).to_bytes()])
    level, width, depth = analyses, files, 0
    while width > 1:
        level = (level | f"Group{depth}[{name}]" >> beam.GroupBy(
                     lambda entry: entry[0] // MERGE_FAN_IN)
                 | f"MergeGroup{depth}[{name}]" >> beam.MapTuple(
                     lambda group, members: (group, merged(
                         [Analysis.from_bytes(data) for _, data in sorted(members)],
                         specs).compact().to_bytes())))
        width, depth = -(-width // MERGE_FAN_IN), depth + 1
    return level | f"Merged[{name}]" >> beam.Values()


def file_statistics(plan: Optional[Plan]) -> Optional[SplitStats]:
    """An empty SplitStats for a file's rows under `plan`, or None without one."""
    return SplitStats(plan, StatisticsGenOptions()) if plan else None


def merged_statistics(name: str, per_file, path: str) -> None:
    """Merges the files' SplitStats (a PCollection) into one, written to `path` (none is
    written when there are none)."""
    _ = (per_file | f"MergeStatistics[{name}]" >> beam.CombineGlobally(MergeSplitStats())
         | f"KeepStatistics[{name}]" >> beam.Map(
             lambda stats: stats is not None and fileio.write_bytes(
                 path, SplitStatsCoder().encode(stats.compact()))))


def read_statistics(path: str) -> Optional[SplitStats]:
    """What `merged_statistics` wrote at `path`, or None."""
    return SplitStatsCoder().decode(fileio.read_bytes(path)) if fileio.exists(path) else None


def _analyse_inputs(make_pipeline, options: TransformOptions, inputs: dict[str, str],
                    raw_schema: schema_pb2.Schema, specs: list[AnalyzerSpec], temp_dir: str,
                    pieces: InputPieces, keep_dir: Optional[str] = None,
                    statistics_plan: Optional[Plan] = None,
                    statistics_path: Optional[str] = None) -> dict[str, Analysis]:
    """{key: the analysis of that Examples folder's analyze split}, one Beam job for all;
    with `keep_dir`, each file's decoded batches kept there (`_AnalyzeFile`); with
    `statistics_plan`, the statistics of every analysed row written to `statistics_path`."""
    if not inputs:
        return {}
    fileio.makedirs(temp_dir)
    if keep_dir:
        fileio.makedirs(keep_dir)
    results = {key: fileio.join(temp_dir, f"analysis-{key}.pkl") for key in inputs}
    with make_pipeline() as pipeline:
        per_file_statistics = []
        for key, examples_dir in inputs.items():
            files = pieces[(examples_dir, options.analyze_split)]
            logging.info("Transform: analysing %d pieces of %s's %s split", len(files),
                         examples_dir, options.analyze_split)
            analysed = (pipeline | f"Files[{key}]" >> beam.Create(list(enumerate(files)))
                        | f"Analyze[{key}]" >> beam.ParDo(_AnalyzeFile(
                            options, raw_schema, keep_dir, statistics_plan)).with_outputs(
                                STATISTICS, main="analyses"))
            _ = (merged_in_file_order(pipeline, analysed.analyses, specs, len(files), key)
                 | f"Keep[{key}]" >> beam.Map(lambda data, path: fileio.write_bytes(path, data),
                                              results[key]))
            per_file_statistics.append(analysed[STATISTICS])
        if statistics_plan:
            merged_statistics("analysed", per_file_statistics | "AllStatistics" >> beam.Flatten(),
                              statistics_path)
    return {key: Analysis.from_bytes(fileio.read_bytes(path)) for key, path in results.items()}


def analyze(make_pipeline, options: TransformOptions, examples_dirs: Sequence[str],
            raw_schema: schema_pb2.Schema, inputs_fn: AnalyzerInputs, graph_dir: str,
            temp_dir: str, pieces: InputPieces, keep_dir: Optional[str] = None,
            statistics_plan: Optional[Plan] = None, statistics_path: Optional[str] = None
            ) -> dict[str, list[str]]:
    """Analyses the analyze split of every input (or takes an input's analysis from the
    analyzer cache) and writes the transform graph into `graph_dir`. Returns the inputs
    analysed and those taken from the cache. With `keep_dir`, the batches the analysis
    decoded are kept there (`kept_copies` of the inputs analysed); with `statistics_plan`,
    the statistics of the rows analysed are written to `statistics_path` (`read_statistics`;
    of every input's rows only when none came from the cache)."""
    # An entry is for this graph (its fingerprint) and this split, schema, settings and
    # library versions (`analysis_key`), and no other.
    cache_dir = options.analyzer_cache_dir
    entry = f"{inputs_fn.fingerprint()}-{analysis_key(options, raw_schema)}" if cache_dir \
        else None

    def cached_path(examples_dir: str) -> Optional[str]:
        if not cache_dir:
            return None
        return fileio.join(cache_dir, dataset_key(examples_dir), entry, ANALYSIS_FILE)

    from_cache = {d: Analysis.from_bytes(fileio.read_bytes(cached_path(d)))
                  for d in examples_dirs if cached_path(d) and fileio.exists(cached_path(d))}
    to_read = {dataset_key(d): d for d in examples_dirs if d not in from_cache}
    read = _analyse_inputs(make_pipeline, options, to_read, raw_schema, inputs_fn.specs,
                           temp_dir, pieces, keep_dir, statistics_plan, statistics_path)
    for key, analysis in read.items():
        if cache_dir:
            fileio.makedirs(fileio.dirname(cached_path(to_read[key])))
            fileio.write_bytes(cached_path(to_read[key]), analysis.to_bytes())
    # In the inputs' order, whichever came from the cache: the same graph either way.
    total = merged([from_cache[d] if d in from_cache else read[dataset_key(d)]
                    for d in examples_dirs], inputs_fn.specs)
    write_transform_graph(inputs_fn.preprocessing_fn, raw_schema, inputs_fn.specs,
                          total.values(), graph_dir, temp_dir)
    return {"analysed": [d for d in examples_dirs if d not in from_cache],
            "from_cache": [d for d in examples_dirs if d in from_cache]}


def write_transform_graph(preprocessing_fn: Callable[[dict], dict],
                          raw_schema: schema_pb2.Schema, specs: list[AnalyzerSpec],
                          values: dict, graph_dir: str, temp_dir: str) -> None:
    """The preprocessing_fn with its statistics as constants, written as tf.Transform writes
    a finished transform graph: `transform_fn/` (SavedModel, vocabularies as assets) and
    `transformed_metadata/` (the output schema, its domains from the graph's annotations,
    and the asset map)."""
    type_specs = tensor_adapter.TensorAdapter(tensor_adapter_config(raw_schema)).TypeSpecs()
    # The asset's file name is the vocabulary's name: a folder of their own.
    vocabulary_dir = fileio.join(temp_dir, "vocabularies")
    fileio.makedirs(vocabulary_dir)

    def preprocessing_fn_with_constants(inputs: dict) -> dict:
        # Traced more than once (the function, then its schema): each trace asks anew.
        constants = analyzers.ConstantAnalyzers(specs, values, vocabulary_dir)
        with analyzers.using(constants):
            outputs = preprocessing_fn(inputs)
        constants.check_all_asked()
        return outputs

    transform_fn = fileio.join(graph_dir, "transform_fn")
    impl_helper.trace_and_write_v2_saved_model(
        transform_fn, preprocessing_fn_with_constants, dict(type_specs), temp_dir,
        baseline_analyzers_fingerprint={}, tensor_replacement_map=None,
        output_keys_to_name_map=None, save_options=None)
    # tf.Transform's writer leaves the output schema inside the SavedModel's folder; its
    # Beam job publishes it beside the SavedModel instead, where TFTransformOutput reads it.
    inner = fileio.join(transform_fn, impl_helper.METADATA_DIR_NAME)
    metadata = metadata_io.read_metadata(inner)
    fileio.rmtree(inner)
    transformed = fileio.join(graph_dir, "transformed_metadata")
    metadata_io.write_metadata(metadata, transformed)
    vocabularies = [s.vocab_filename or s.key for s in specs if s.kind == "vocabulary"]
    if vocabularies:
        fileio.write_text(fileio.join(transformed, "asset_map"),
                          json.dumps({name: name for name in vocabularies}))


class _TransformFile(beam.DoFn):
    """A piece of one split -> its rows transformed (as the general path's TransformDataset
    transforms them) and encoded into chunks of their own, ordered by the piece's place among
    the split's pieces, so the split keeps the input's row order. An element is (that place,
    the piece, the copy of its decoded batches the analysis kept, or None): a kept copy is
    read instead of the file, then removed. The tagged output ROW_COUNTS has (split, rows,
    records)."""

    def __init__(self, raw_schema: schema_pb2.Schema, graph_dir: str, split: str,
                 schema: schema_pb2.Schema, staging: str, sharding: shards.ShardingOptions,
                 statistics_plan: Optional[Plan] = None):
        self._raw_schema, self._graph_dir = raw_schema, graph_dir
        self._split, self._schema = split, schema
        self._staging, self._sharding = staging, sharding
        self._statistics_plan = statistics_plan

    def setup(self):
        self._adapter = RawTensorAdapter(self._raw_schema)
        if self._graph_dir not in _loaded:
            output = tft.TFTransformOutput(self._graph_dir)
            # As tf.Transform's own TransformDataset applies a graph: finalized for the
            # adapter's tensors. Unfinalized, each call first tries a signature that does
            # not fit, and the TypeError it catches prints every input tensor.
            loader = saved_transform_io_v2.SavedModelLoader(output.transform_savedmodel_dir)
            loader.finalize(list(self._adapter.type_specs()), list(loader.structured_outputs))
            _loaded[self._graph_dir] = (loader.apply_transform_model,
                                        impl_helper.make_tensor_to_arrow_converter(
                                            output.transformed_metadata.schema))
        self._apply_graph, self._converter = _loaded[self._graph_dir]

    def process(self, element: tuple[int, Piece, Optional[str]]):
        place, path, kept = element
        encoder = SplitEncoder(self._split, self._schema, self._staging, self._sharding, place)
        stats = file_statistics(self._statistics_plan)
        # A retried piece whose copy an earlier attempt read and removed decodes its file.
        kept = kept if kept and fileio.exists(kept) else None
        batches = kept_batches(kept) if kept else record_batches(path, self._raw_schema)
        with EncodingThread(encoder) as encoding:
            for rows, tensors in read_ahead(((batch.num_rows, self._adapter.to_tensors(batch))
                                             for batch in batches), READ_AHEAD):
                transformed = self._converter.convert(self._apply_graph(tensors))
                rows_done.add(rows)
                if stats:
                    summarise(stats, transformed)
                encoding.add(transformed)
            chunks = encoding.close()
        if kept:
            # Read once: removed now, what the disk has not yet written of it is never
            # written, and the staging folder holds only the copies still to be read.
            fileio.remove(kept)
        yield from chunks
        release_free_memory()
        yield beam.pvalue.TaggedOutput(ROW_COUNTS, (self._split, encoder.rows, encoder.records))
        if stats:
            yield beam.pvalue.TaggedOutput(STATISTICS, stats.compact())


def release(graph_dir: str) -> None:
    """Forgets the graph this process loaded from `graph_dir` (once its job is done)."""
    _loaded.pop(graph_dir, None)


def transformed_chunks(pipeline, split: str, pieces: Sequence[Piece],
                       raw_schema: schema_pb2.Schema, graph_dir: str,
                       kept: Optional[dict[Piece, str]], schema: schema_pb2.Schema,
                       staging: str, sharding: shards.ShardingOptions,
                       statistics_plan: Optional[Plan] = None):
    """One split's rows (its `pieces` of every input, in order), transformed and encoded: a
    PCollection of chunks (main output "chunks") and of (split, rows, records) counts
    (ROW_COUNTS); with `statistics_plan`, each piece's statistics of its transformed rows
    (STATISTICS). A piece with a copy in `kept` ({piece: its decoded copy}) is read from
    the copy."""
    kept = kept or {}
    files = [(place, piece, kept.get(piece)) for place, piece in enumerate(pieces)]
    return (pipeline | f"Files[{split}]" >> beam.Create(files)
            | f"Transform[{split}]" >> beam.ParDo(_TransformFile(
                raw_schema, graph_dir, split, schema, staging, sharding,
                statistics_plan)).with_outputs(ROW_COUNTS, STATISTICS, main="chunks"))
