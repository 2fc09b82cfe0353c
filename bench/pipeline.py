"""`python -m bench pipeline`: the whole pipeline, stage by stage, ours against TFX's own taxi
pipeline, each side timed as a user waits for it: a whole fresh child process, imports
included, on the same seeded taxi-like CSV (`testsupport.data.taxi_like_table`, one file with a
bare header line in a folder of its own).

- `stock`: TFX's `taxi_pipeline_native_keras` example from the installed tfx wheel, built by
  its own `_create_pipeline` with its own module file (`taxi_utils_native_keras.py`) and Beam
  arguments (the DirectRunner in multi-processing mode, a worker per CPU), pointed at the CSV
  folder, a fresh pipeline root, a fresh SQLite metadata file and a serving folder of its own,
  and run on LocalDagRunner.
- `ours`: `tfrp run --dataset taxi --data-root <CSV folder> --output-root <fresh folder>`.
  Like stock's Transform (`disable_statistics=False`, its default), ours writes the statistics
  of the rows before and after it, so the Transform rows compare like with like.
- `ours-no-statistics`: the same run with `--set disable_statistics=true` (Transform's stock
  setting), which shows what the statistics cost.

Steps: both Trainers run the example's 1,000 train steps and 150 eval steps (`--train-steps`
and `--eval-steps` for ours; another `--train-steps` is also set on the stock Trainer's
train_args). The same steps are not the same rows seen: stock's model takes 40 rows a step,
ours 256 and may stop sooner (max_epochs, early stopping), as each ships. So each run's model
quality is recorded beside its times: a speed-up must not come from a worse model. The
quality is the Evaluator's overall metrics on the eval split (`tfma.load_metrics` on its
ModelEvaluation): BinaryAccuracy on both sides, AUC on ours.

Per stage, from each run's ML Metadata: every execution's component id and its
create_time_since_epoch .. last_update_time_since_epoch, mapped to a stage both pipelines
share (`STAGE_OF`); beside them the whole process's wall time and what lies outside the
components (wall minus their sum: imports, building the pipeline, the runner's work between
components, exit), split into before the first component and after the last.

Peak memory per stage: the run's process tree sampled every 50 ms by `bench.memory`, each
sample the tree's resident high-water mark since the one before (read, then reset), so a
stage's peak is the highest sample while its component ran: exact, not a snapshot.

Rows per stage (`ROW_BASIS`): a stage's input rows, counted by StatisticsGen: every split's
rows for ExampleGen, statistics and Transform, the eval split's for the Evaluator. Between
the smallest and the largest size a side ran, a stage's marginal rate is
(rows_large - rows_small) / (seconds_large - seconds_small): what one more row costs, with
the stage's fixed costs cancelled.

Repeats: for each size the sides run interleaved, one of each per repeat, so drift in the
machine hits them alike; medians per (side, size).
"""
from __future__ import annotations

import importlib
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Callable, Optional, Sequence

from bench import memory
from bench.display import Table
from tfrecord_shards import fileio

SIDES = ("stock", "ours", "ours-no-statistics")
NO_STATISTICS = "ours-no-statistics"
# The sides `python -m bench pipeline` runs unless told.
DEFAULT_SIDES = ("stock", "ours")
STOCK_EXAMPLE = "tfx.examples.chicago_taxi_pipeline.taxi_pipeline_native_keras"
STOCK_MODULE_FILE = "taxi_utils_native_keras.py"
# The steps the stock example gives its Trainer (train_args, eval_args); tested against it.
STOCK_TRAIN_STEPS = 1000
STOCK_EVAL_STEPS = 150
METADATA_FILE = "metadata.db"

RESOLVERS = "resolvers"
STAGES = ("ExampleGen", "StatisticsGen", "SchemaGen", "ExampleValidator", "Transform",
          RESOLVERS, "Trainer", "Evaluator", "Pusher")
OUTSIDE = "outside components"
# The parts of OUTSIDE before the first component (imports, building the pipeline) and after
# the last (exit); the rest is the runner's work between components.
BEFORE_FIRST, AFTER_LAST = "before 1st component", "after last component"
WHOLE = "whole process"
# Each pipeline's component ids (stock's example, ours from pipeline/pipeline.py) -> stage.
STAGE_OF = {
    "CsvExampleGen": "ExampleGen", "ShardedExampleGen": "ExampleGen",
    "StatisticsGen": "StatisticsGen",
    "SchemaGen": "SchemaGen", "ImportSchemaGen": "SchemaGen",
    "ExampleValidator": "ExampleValidator",
    "Transform": "Transform", "ShardedTransform": "Transform",
    "latest_blessed_model_resolver": RESOLVERS, "production_model": RESOLVERS,
    "span_resolver": RESOLVERS,
    "Trainer": "Trainer", "Evaluator": "Evaluator", "Pusher": "Pusher",
}
# Which rows a stage reads: "all" (every split) or "eval" (the eval split); stages not named
# read statistics, a model or a fixed number of training steps, not rows.
ROW_BASIS = {"ExampleGen": "all", "StatisticsGen": "all", "Transform": "all",
             "Evaluator": "eval"}
# The metrics the table shows, of those the Evaluator wrote.
QUALITY = ("binary_accuracy", "auc")


def stock_pipeline(data_dir: str, run_dir: str, train_steps: int = STOCK_TRAIN_STEPS):
    """The stock example's pipeline by its own `_create_pipeline`, everything it writes below
    `run_dir`; `train_steps` replaces the example's number when it differs."""
    example = importlib.import_module(STOCK_EXAMPLE)
    pipeline = example._create_pipeline(
        pipeline_name=example._pipeline_name,
        pipeline_root=fileio.join(run_dir, "root"),
        data_root=data_dir,
        module_file=fileio.join(fileio.dirname(example.__file__), STOCK_MODULE_FILE),
        serving_model_dir=fileio.join(run_dir, "serving"),
        metadata_path=fileio.join(run_dir, METADATA_FILE),
        beam_pipeline_args=example._beam_pipeline_args)
    if train_steps != trainer_steps(pipeline)[0]:
        trainer = next(c for c in pipeline.components if c.id == "Trainer")
        trainer.exec_properties["train_args"] = json.dumps({"num_steps": train_steps})
    return pipeline


def trainer_steps(pipeline) -> tuple[int, int]:
    """(train steps, eval steps) of a pipeline's Trainer."""
    trainer = next(c for c in pipeline.components if c.id == "Trainer")
    return tuple(json.loads(trainer.exec_properties[name])["num_steps"]
                 for name in ("train_args", "eval_args"))


def _run_stock(data_dir: str, run_dir: str, train_steps: int) -> None:
    """The stock side's child process."""
    from tfx import v1 as tfx

    pipeline = stock_pipeline(data_dir, run_dir, train_steps)
    # TFX's Beam executors parse sys.argv with absl's flags; the pipeline takes nothing from
    # this command line.
    sys.argv = sys.argv[:1]
    tfx.orchestration.LocalDagRunner().run(pipeline)


def side_command(side: str, data_dir: str, run_dir: str, train_steps: int) -> list[str]:
    """The child process a side runs as."""
    if side == "stock":
        return [sys.executable, "-m", "bench.pipeline", data_dir, run_dir, str(train_steps)]
    return [sys.executable, "-m", "pipeline.cli", "run",
            *run_arguments(data_dir, run_dir, train_steps),
            "--set", f"disable_statistics={side == NO_STATISTICS}"]


def taxi_data(work_dir: str, rows: int) -> str:
    """The folder of the seeded taxi-like CSV of `rows` rows under `work_dir` (written once,
    kept for later runs at that size)."""
    from testsupport import data

    data_dir = fileio.join(work_dir, "pipeline-data", f"taxi-{rows}")
    data.write_taxi_csv(rows, data_dir)
    return data_dir


def run_arguments(data_dir: str, run_dir: str, train_steps: int) -> list[str]:
    """`tfrp run`'s arguments for our side on the taxi-like CSV in `data_dir`, its outputs
    and metadata store in `run_dir`."""
    return ["--dataset", "taxi", "--data-root", data_dir, "--output-root", run_dir,
            "--set", f"metadata_path={fileio.join(run_dir, METADATA_FILE)}",
            "--train-steps", str(train_steps), "--eval-steps", str(STOCK_EVAL_STEPS)]


def read_run(metadata_path: str) -> dict:
    """One finished run, from its ML Metadata store (the only run in it): seconds per
    component id and per stage, its first component's start and last one's end (epoch
    seconds), the rows per split StatisticsGen counted, the Evaluator's overall metrics of
    the new model on the eval split, and whether it was blessed."""
    import tensorflow_model_analysis as tfma
    from ml_metadata import metadata_store
    from ml_metadata.proto import metadata_store_pb2

    from components.example_gen import artifacts as tfx_artifacts

    config = metadata_store_pb2.ConnectionConfig()
    config.sqlite.filename_uri = metadata_path
    config.sqlite.connection_mode = metadata_store_pb2.SqliteMetadataSourceConfig.READONLY
    store = metadata_store.MetadataStore(config)
    executions = sorted(store.get_executions(), key=lambda e: e.id)
    if not executions:
        raise RuntimeError(f"{metadata_path}: no executions")
    components: dict[str, float] = {}
    windows: dict[str, tuple[float, float]] = {}  # epoch seconds each component ran
    stages: dict[str, float] = {}
    outputs: dict[tuple[str, str], list] = {}  # (stage, artifact type) -> artifacts
    for execution in executions:
        node = _component_id(store, execution)
        if execution.last_known_state != metadata_store_pb2.Execution.COMPLETE:
            state = metadata_store_pb2.Execution.State.Name(execution.last_known_state)
            raise RuntimeError(f"{metadata_path}: {node} ended {state}, not COMPLETE (a "
                               "benchmark run starts from an empty store and reuses nothing)")
        if node not in STAGE_OF:
            raise RuntimeError(f"{metadata_path}: component {node!r} has no stage in "
                               "bench.pipeline.STAGE_OF")
        seconds = (execution.last_update_time_since_epoch -
                   execution.create_time_since_epoch) / 1000
        components[node] = seconds
        windows[node] = (execution.create_time_since_epoch / 1000,
                         execution.last_update_time_since_epoch / 1000)
        stages[STAGE_OF[node]] = stages.get(STAGE_OF[node], 0.0) + seconds
        for artifact in _outputs(store, execution):
            outputs.setdefault((STAGE_OF[node], artifact.type), []).append(artifact)
    split_rows = {}
    # Stock's Transform outputs statistics too, of the rows before and after it.
    for artifact in outputs.get(("StatisticsGen", "ExampleStatistics"), []):
        for split in json.loads(artifact.properties["split_names"].string_value):
            path = fileio.join(artifact.uri, f"Split-{split}", "FeatureStats.pb")
            split_rows[split] = tfx_artifacts.load_statistics(path).datasets[0].num_examples
    quality = {}
    for evaluation in outputs.get(("Evaluator", "ModelEvaluation"), []):
        for slice_metrics in tfma.load_metrics(evaluation.uri):
            if slice_metrics.slice_key.single_slice_keys:
                continue  # only the overall slice
            for item in slice_metrics.metric_keys_and_values:
                if item.value.HasField("double_value") and not item.key.is_diff and \
                        item.key.model_name != tfma.BASELINE_KEY:
                    quality[item.key.name] = item.value.double_value.value
    blessings = [a.custom_properties["blessed"].int_value == 1
                 for a in outputs.get(("Evaluator", "ModelBlessing"), [])
                 if "blessed" in a.custom_properties]
    return {"components": components, "windows": windows, "stage_seconds": stages,
            "first_start": min(e.create_time_since_epoch for e in executions) / 1000,
            "last_end": max(e.last_update_time_since_epoch for e in executions) / 1000,
            "split_rows": split_rows, "quality": quality,
            "blessed": blessings[0] if blessings else None}


def _component_id(store, execution) -> str:
    """An execution's component id: its "node" context is named <pipeline>.<component id>."""
    return next((c.name.split(".", 1)[-1] for c in store.get_contexts_by_execution(execution.id)
                 if c.type == "node"), execution.type)


def _outputs(store, execution) -> list:
    """The artifacts `execution` output, each with its type name set as `.type`."""
    from ml_metadata.proto import metadata_store_pb2

    kinds = (metadata_store_pb2.Event.OUTPUT, metadata_store_pb2.Event.DECLARED_OUTPUT)
    ids = sorted({e.artifact_id for e in store.get_events_by_execution_ids([execution.id])
                  if e.type in kinds})
    artifacts = store.get_artifacts_by_id(ids)
    for artifact in artifacts:
        artifact.type = store.get_artifact_types_by_id([artifact.type_id])[0].name
    return artifacts


def stage_rows(split_rows: dict[str, int]) -> dict[str, int]:
    """Each row-bound stage's input rows (`ROW_BASIS`)."""
    rows = {"all": sum(split_rows.values()), "eval": split_rows.get("eval", 0)}
    return {stage: rows[basis] for stage, basis in ROW_BASIS.items()}


def measure(side: str, data_dir: str, run_dir: str, train_steps: int,
            keep: bool = False) -> dict:
    """One run of a side as a whole child process, read back from its metadata store; its
    folder is removed afterwards unless `keep`."""
    if fileio.exists(run_dir):
        fileio.rmtree(run_dir)
    fileio.makedirs(run_dir)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    env.setdefault("TF_USE_LEGACY_KERAS", "1")
    started_at, start = time.time(), time.perf_counter()
    with subprocess.Popen(side_command(side, data_dir, run_dir, train_steps),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=env) as child, memory.PeakSampler(child.pid) as sampler:
        stdout, stderr = child.communicate()
    wall = time.perf_counter() - start
    ended_at = started_at + wall
    if child.returncode != 0:
        raise RuntimeError(f"{side} failed (exit {child.returncode}) on {data_dir}:\n"
                           f"{(stderr or stdout)[-3000:]}")
    run = read_run(fileio.join(run_dir, METADATA_FILE))
    stage_peaks: dict[str, int] = {}
    for node, (begin, end) in run["windows"].items():
        stage = STAGE_OF[node]
        stage_peaks[stage] = max(stage_peaks.get(stage, 0), sampler.peak(begin, end))
    if keep:
        fileio.write_text(fileio.join(run_dir, "stdout.txt"), stdout)
        fileio.write_text(fileio.join(run_dir, "stderr.txt"), stderr)
    else:
        fileio.rmtree(run_dir)
    inside = sum(run["components"].values())
    return {"side": side, "rows": sum(run["split_rows"].values()),
            "process_seconds": wall, "components_seconds": inside,
            "outside_seconds": wall - inside,
            "before_first_seconds": run["first_start"] - started_at,
            "after_last_seconds": ended_at - run["last_end"],
            "stage_seconds": run["stage_seconds"], "components": run["components"],
            "split_rows": run["split_rows"], "stage_rows": stage_rows(run["split_rows"]),
            "quality": run["quality"], "blessed": run["blessed"],
            "stage_peak_bytes": stage_peaks, "process_peak_bytes": sampler.peak()}


def summarise(samples: list[dict]) -> dict:
    """Medians of one (side, size)'s repeats, and the samples themselves."""
    stages = [s for s in STAGES if any(s in sample["stage_seconds"] for sample in samples)]
    metrics = sorted({m for sample in samples for m in sample["quality"]})
    return {
        "rows": samples[0]["rows"], "split_rows": samples[0]["split_rows"],
        "stage_rows": samples[0]["stage_rows"],
        **{f"median_{key}": statistics.median(s[key] for s in samples)
           for key in ("process_seconds", "components_seconds", "outside_seconds",
                       "before_first_seconds", "after_last_seconds")},
        "median_stage_seconds": {stage: statistics.median(
            s["stage_seconds"].get(stage, 0.0) for s in samples) for stage in stages},
        "median_quality": {m: statistics.median(s["quality"][m] for s in samples
                                                if m in s["quality"]) for m in metrics},
        "blessed": [s["blessed"] for s in samples],
        "median_stage_peak_bytes": {stage: statistics.median(
            s["stage_peak_bytes"].get(stage, 0) for s in samples) for stage in stages},
        "median_process_peak_bytes": statistics.median(s["process_peak_bytes"]
                                                       for s in samples),
        "samples": samples}


def stage_seconds(entry: dict) -> dict[str, float]:
    """A summary's seconds per stage, then outside the components (and its parts before the
    first and after the last) and the whole process."""
    return {**entry["median_stage_seconds"], OUTSIDE: entry["median_outside_seconds"],
            BEFORE_FIRST: entry["median_before_first_seconds"],
            AFTER_LAST: entry["median_after_last_seconds"],
            WHOLE: entry["median_process_seconds"]}


def marginal_rates(runs: dict[str, dict]) -> Optional[dict]:
    """Rows/s per row-bound stage and for the whole process between the smallest and the
    largest size of one side's `runs` ({str(rows): summary}); None with fewer than two sizes.
    A stage whose time did not grow has no rate (None)."""
    if len(runs) < 2:
        return None
    small, large = (runs[k] for k in (min(runs, key=int), max(runs, key=int)))
    rates = {}
    for stage in [*ROW_BASIS, WHOLE]:
        rows = (large["stage_rows"].get(stage, large["rows"]) -
                small["stage_rows"].get(stage, small["rows"]))
        grew = stage_seconds(large).get(stage, 0.0) - stage_seconds(small).get(stage, 0.0)
        rates[stage] = rows / grew if grew > 0 else None
    return {"from_rows": small["rows"], "to_rows": large["rows"], "rows_per_second": rates}


def run_benchmark(sizes: Sequence[int], work_dir: str, repeats: int = 1,
                  sides: Sequence[str] = DEFAULT_SIDES, train_steps: Optional[int] = None,
                  log: Callable[[str], None] = print, keep_runs: bool = False) -> dict:
    """Each side at each size `repeats` times (sides interleaved); medians per (side, size),
    stock's over ours' seconds per stage at each size, and each side's marginal rates."""
    unknown = sorted(set(sides) - set(SIDES))
    if unknown or not sides:
        raise ValueError(f"sides {', '.join(unknown) or '(none)'}: choose from "
                         f"{', '.join(SIDES)}")
    train_steps = STOCK_TRAIN_STEPS if train_steps is None else train_steps
    samples: dict[str, dict[str, list]] = {side: {} for side in sides}
    for rows in sorted(set(sizes)):
        data_dir = taxi_data(work_dir, rows)
        for repeat in range(repeats):
            for side in sides:
                run_dir = fileio.join(work_dir, "pipeline-runs", side if not keep_runs
                                      else f"{side}-{rows}-{repeat + 1}")
                sample = measure(side, data_dir, run_dir, train_steps, keep_runs)
                if sample["rows"] != rows:
                    raise RuntimeError(f"{side}: StatisticsGen counted {sample['rows']:,} rows "
                                       f"of {rows:,}")
                samples[side].setdefault(str(rows), []).append(sample)
                log(f"{side} {rows:,} rows, repeat {repeat + 1}/{repeats}: "
                    f"{sample['process_seconds']:.1f} s (" + ", ".join(
                        f"{stage} {sample['stage_seconds'][stage]:.1f}" for stage in STAGES
                        if stage in sample["stage_seconds"]) +
                    f"; outside components {sample['outside_seconds']:.1f})")
    runs = {side: {rows: summarise(items) for rows, items in by_size.items()}
            for side, by_size in samples.items()}
    result = {"sizes": sorted(set(sizes)), "sides": list(sides), "repeats": repeats,
              "train_steps": train_steps, "eval_steps": STOCK_EVAL_STEPS, "runs": runs,
              "marginal": {side: marginal_rates(runs[side]) for side in sides
                           if marginal_rates(runs[side])}}
    if {"stock", "ours"} <= set(sides):
        result["stock_over_ours"] = {rows: speedups(runs["stock"][rows], runs["ours"][rows])
                                     for rows in runs["ours"]}
    return result


def speedups(stock: dict, ours: dict) -> dict[str, float]:
    """Stock's median seconds over ours, per stage both ran and for the whole process."""
    ours_seconds = stage_seconds(ours)
    return {stage: seconds / ours_seconds[stage]
            for stage, seconds in stage_seconds(stock).items() if ours_seconds.get(stage)}


def size_label(rows: int) -> str:
    """20000 -> 20k, 3000000 -> 3M."""
    for unit, scale in (("M", 1_000_000), ("k", 1_000)):
        if rows >= scale:
            return f"{rows / scale:g}{unit}"
    return str(rows)


def table(result: dict) -> Table:
    """Median seconds per stage for each side and size, and stock's seconds over ours; then
    the marginal rates and each run's model quality."""
    sizes, sides = result["sizes"], result["sides"]
    ratios = "stock_over_ours" in result
    ran = {stage for side in sides for rows in sizes
           for stage in result["runs"][side][str(rows)]["median_stage_seconds"]}
    names = [s for s in STAGES if s in ran] + [OUTSIDE, BEFORE_FIRST, AFTER_LAST, WHOLE]
    rows_shown: dict[str, dict] = {name: {} for name in names}
    columns = []
    for rows in sizes:
        label = size_label(rows)
        for side in sides:
            key = f"{side}@{rows}"
            columns.append((f"{side} {label} s", key, "{}"))
            seconds = stage_seconds(result["runs"][side][str(rows)])
            for name in names:
                rows_shown[name][key] = f"{seconds[name]:.1f}" if name in seconds else "-"
        if ratios:
            key = f"ratio@{rows}"
            columns.append((f"{label} stock/ours", key, "{}"))
            for name in names:
                ratio = result["stock_over_ours"][str(rows)].get(name)
                rows_shown[name][key] = f"{ratio:.2f}x" if ratio else "-"
    lines = [f"Medians of {result['repeats']} run(s) per side and size; "
             f"{result['train_steps']:,} train and {result['eval_steps']} eval steps on both "
             "sides; outside components: the whole process minus its components (of which "
             "before the 1st and after the last)."]
    marginal = result["marginal"]
    if marginal:
        span = next(iter(marginal.values()))
        lines.append(f"Marginal rows/s, {size_label(span['from_rows'])} to "
                     f"{size_label(span['to_rows'])} rows (the stage's input rows):")
        for stage in [*ROW_BASIS, WHOLE]:
            basis = "eval rows" if ROW_BASIS.get(stage) == "eval" else "all rows"
            rates = [(side, found["rows_per_second"][stage])
                     for side, found in marginal.items()]
            lines.append(f"  {stage:<14} {basis:<9}" + "".join(
                f"  {side} " + (f"{rate:,.0f}" if rate else "no growth")
                for side, rate in rates))
    for rows in sizes:
        parts = []
        for side in sides:
            entry = result["runs"][side][str(rows)]
            metrics = ", ".join(f"{m} {entry['median_quality'][m]:.4f}" for m in QUALITY
                                if m in entry["median_quality"]) or "no metrics"
            parts.append(f"{side} {metrics} on {entry['split_rows'].get('eval', 0):,} eval "
                         "rows")
        lines.append(f"Model quality at {size_label(rows)} rows: " + "; ".join(parts))
    for rows in sizes:
        for side in sides:
            entry = result["runs"][side][str(rows)]
            peaks = entry.get("median_stage_peak_bytes", {})
            lines.append(f"Peak RSS (MiB) at {size_label(rows)} rows, {side}: " + ", ".join(
                f"{stage} {peaks[stage] / 2**20:,.0f}" for stage in STAGES if stage in peaks) +
                f"; whole process tree {entry['median_process_peak_bytes'] / 2**20:,.0f}")
    return Table(rows_shown, columns, summary="\n".join(lines))


# The chart's stacks: row-bound stages alone, the quick ones together.
CHART_STACKS = (("ExampleGen", ("ExampleGen",)), ("StatisticsGen", ("StatisticsGen",)),
                ("Transform", ("Transform",)), ("Trainer", ("Trainer",)),
                ("Evaluator", ("Evaluator",)),
                ("other components", ("SchemaGen", "ExampleValidator", RESOLVERS, "Pusher")),
                (OUTSIDE, (OUTSIDE,)))
CHART_COLOURS = ("#4878a8", "#72a8d0", "#e08a3c", "#6aa84f", "#b45f9e", "#a0a0a0", "#d9d9d9")


def chart(result: dict, path: str) -> str:
    """One panel per size, a bar per side stacked by stage (seconds), each bar labelled with
    its whole process's seconds (and, for ours beside stock, how many times faster).
    Writes a PNG and returns its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes, sides = result["sizes"], result["sides"]
    width = max(6.0, 3.0 + 0.95 * len(sizes) * len(sides))  # the legend takes ~2 inches
    figure, panels = plt.subplots(1, len(sizes), figsize=(width, 4.2), dpi=100, squeeze=False)
    for panel, rows in zip(panels[0], sizes):
        bottoms = [0.0] * len(sides)
        seconds = [stage_seconds(result["runs"][side][str(rows)]) for side in sides]
        for (name, members), colour in zip(CHART_STACKS, CHART_COLOURS):
            heights = [sum(s.get(m, 0.0) for m in members) for s in seconds]
            panel.bar(sides, heights, bottom=bottoms, color=colour, label=name, width=0.6)
            bottoms = [b + h for b, h in zip(bottoms, heights)]
        for index, side in enumerate(sides):
            text = f"{seconds[index][WHOLE]:,.0f} s"
            ratio = result.get("stock_over_ours", {}).get(str(rows), {}).get(WHOLE)
            if side == "ours" and "stock" in sides and ratio:
                text += f"\n{ratio:.1f}x faster"
            panel.annotate(text, (index, seconds[index][WHOLE]), ha="center", va="bottom",
                           fontsize=8, xytext=(0, 2), textcoords="offset points")
        panel.set_title(f"{size_label(rows)} rows", fontsize=10)
        panel.set_ylim(0, max(s[WHOLE] for s in seconds) * 1.2)
        panel.spines[["top", "right"]].set_visible(False)
    panels[0][0].set_ylabel("seconds (whole process)")
    handles, labels = panels[0][0].get_legend_handles_labels()
    figure.legend(handles[::-1], labels[::-1], loc="center right", fontsize=8, frameon=False)
    figure.suptitle(f"Whole pipeline, seconds per stage ({result['train_steps']:,} train "
                    f"steps; medians of {result['repeats']})", fontsize=10)
    figure.tight_layout(rect=(0, 0, 1 - 2.0 / width, 1))
    figure.savefig(path)
    plt.close(figure)
    return path


if __name__ == "__main__":
    _run_stock(sys.argv[1], sys.argv[2], int(sys.argv[3]))
