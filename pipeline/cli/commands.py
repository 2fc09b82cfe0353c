"""`tfrp`'s product commands: run and report a pipeline, compile and submit it, ExampleGen on
its own, look into shards, fuzz, and the servers (tf.data service, a Spark cluster). The
benchmarks are `bench.py`'s."""
from __future__ import annotations

import logging
import os
import socket
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import click  # noqa: E402

from components import fileio, listening  # noqa: E402
from components.example_gen.options import ExampleGenOptions  # noqa: E402
from components.trainer.options import DATA_SERVICE_PORT  # noqa: E402
from pipeline.cli.options import given_settings, setting_options, usage_error  # noqa: E402
from pipeline.cli.output import Commands, configure_output, one_line  # noqa: E402
from pipeline.kubernetes_platform import DEFAULT_TARGET, TARGETS  # noqa: E402

# Where `compile` writes and `submit` reads: a YAML package, which kfp's client and Vertex take.
COMPILED_PIPELINE = "build/pipeline.yaml"


@click.group(cls=Commands)
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
        raise click.ClickException(f"the run failed: {one_line(e)}") from e
    click.echo(summary.format(components=False))  # the progress printed each one
    from pipeline import report

    config = local_runner.local_config(config)
    # This run's page, not the latest run's: another may have started since this one ended.
    path = report.write_report(config.metadata_path, config.pipeline_name,
                               report.default_path(config.output_root, config.pipeline_name),
                               summary.run_id)
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
@click.option("--target", type=click.Choice(list(TARGETS)), default=DEFAULT_TARGET,
              show_default=True,
              help="The backend: kfp, open-source Kubeflow Pipelines (kubeflow is the same); "
                   "vertex, Vertex AI Pipelines. Each takes its own accelerator names; kfp's "
                   "file carries the tasks' Kubernetes secrets and node selectors.")
@click.option("--output", default=COMPILED_PIPELINE, show_default=True,
              help="A .yaml (or .yml) file is the package kfp's client uploads and runs, and "
                   "Vertex takes; any other name, the spec as JSON. A path or a bucket's URI.")
def compile_command(config_file, assignments, target, output, **named) -> None:
    """Compile the pipeline for Kubeflow Pipelines v2 or Vertex AI, every component in the
    configured image (a task given an accelerator, its GPU image)."""
    config = _load_config(config_file, assignments, **named)
    from pipeline import kubeflow_runner

    try:
        path = kubeflow_runner.compile_pipeline(config, output, target)
    except ValueError as e:
        raise click.ClickException(str(e))
    click.echo(f"Compiled {config.pipeline_name} ({target}, image {config.image_uri}) to {path}")


@main.command()
@click.option("--template", default=COMPILED_PIPELINE, show_default=True,
              help="The output of `tfrp compile --target vertex` (YAML or JSON; a path, or "
                   "gs://...).")
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
    except (vertex_runner.ParameterError, vertex_runner.TemplateError,
            FileNotFoundError) as error:
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
