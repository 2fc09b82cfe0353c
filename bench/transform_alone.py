"""Transform alone, in a whole process, on a kept `bench pipeline` run's ExampleGen output:
the taxi pipeline's Transform settings (the columnar analysis, 1,024 rows a packed block, gzip
level 1 in 96 KiB members) with the passes' pre- and post-transform statistics, as the
pipeline's ShardedTransform runs them. Prints one JSON line: the seconds of the analysis, of
the transform pass and of the whole, the CPU-s of each pass and of the process, and the peak
RSS in MiB.

    python -m bench.transform_alone RUN OUT

RUN is a run folder that `python -m bench pipeline ... --keep-runs` kept (it holds
pipelines/tfrp-taxi/); OUT is a folder to write into (emptied first). With BEAM_ARGS in the
environment (`--direct_running_mode=multi_processing --direct_num_workers=2`), the Beam
jobs run on a pipeline made of those args.
"""
from __future__ import annotations

import json
import os
import resource
import sys
import time


def main(run: str, out: str) -> None:
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from components.transform import beam_job, columnar_job, feature_stats, taxi
    from components.transform.executor import statistics_columns
    from components.transform.options import TransformOptions
    from tfrecord_shards import fileio
    from tfrecord_shards.codec import parser, schema_file

    base = fileio.join(run, "pipelines", "tfrp-taxi")
    examples = sorted(fileio.glob(fileio.join(base, "ShardedExampleGen", "examples", "*")))[0]
    schema = schema_file.load_schema(fileio.join(base, "ImportSchemaGen", "schema", "1",
                                                 "schema.pbtxt"))
    raw = beam_job.mark_images(schema, beam_job.shards_schema(examples))
    options = TransformOptions.from_json(json.dumps({
        "analysis": "columnar", "label_key": taxi.TAXI_LABEL, "packed_rows": 1024,
        "preprocessing_fn": taxi.PREPROCESSING_FN, "task": "binary",
        "sharding": {"compression": "gzip", "compression_level": 1, "gzip_member_kib": 96}}))
    seconds: dict[str, float] = {}

    def timed(name: str, function):
        def run_timed(*args, **kwargs):
            started, cpu = time.perf_counter(), sum(os.times()[:2])
            try:
                return function(*args, **kwargs)
            finally:
                seconds[name] = time.perf_counter() - started
                seconds[f"{name}_cpu"] = sum(os.times()[:2]) - cpu
        return run_timed

    columnar_job.analyze = timed("analyze", columnar_job.analyze)
    beam_job._transform = timed("transform", beam_job._transform)  # noqa: SLF001 - timed
    started = time.perf_counter()
    statistics = feature_stats.pass_statistics(
        [examples], "train", raw, statistics_columns(options, raw), parser.active_schema(raw))
    if fileio.exists(out):
        fileio.rmtree(out)
    beam_args = os.environ.get("BEAM_ARGS", "").split()
    make_pipeline = (lambda: beam.Pipeline(options=PipelineOptions(beam_args))) \
        if beam_args else None
    beam_job.run(options, [examples], raw, fileio.join(out, "graph"), fileio.join(out, "ex"),
                 make_pipeline=make_pipeline, splits=["train", "eval"], statistics=statistics)
    seconds["total"] = time.perf_counter() - started
    seconds["maxrss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    seconds["cpu"] = sum(os.times()[:2])
    print(json.dumps({name: round(value, 2) for name, value in seconds.items()}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
