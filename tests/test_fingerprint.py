"""The source fingerprint ExampleGen's cache key holds, and the check that ExampleGen reads
the files it was fingerprinted with: real taxi trips in plain and gzip CSV files on a disk,
and real objects on the GCS and S3 emulators (tests/object_stores.py), where a file replaced
by one of the same size must change the fingerprint through its generation or ETag."""
from __future__ import annotations

import glob
import gzip
import json
import os
import sys
import threading
import time

import pytest

from tfrecord_shards import shards
from components.example_gen import engine
from components.example_gen.inputs import own_fingerprint, settle_inputs
from components.example_gen.options import ExampleGenOptions
from testsupport import faults

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROWS = 150  # taxi trips a file
CHANGED = "the source changed during the run"


def write_rows(path: str, lines: list[str]) -> None:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "wt", encoding="utf-8") as f:
        f.writelines(lines)


def read_rows(path: str) -> list[str]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return f.readlines()


def taxi_parts(folder, taxi_csv: str, names: tuple[str, ...]) -> list[str]:
    """`names` in `folder`, each ROWS taxi trips under the header, gzip where the name ends
    in .gz, written an hour ago (as a source is: well before a run fingerprints it)."""
    with open(taxi_csv, encoding="utf-8") as f:
        header, *trips = [next(f) for _ in range(1 + ROWS * len(names))]
    folder.mkdir()
    paths = []
    hour_ago = time.time_ns() - 3600 * 10**9
    for i, name in enumerate(names):
        path = str(folder / name)
        write_rows(path, [header, *trips[i * ROWS:(i + 1) * ROWS]])
        os.utime(path, ns=(hour_ago, hour_ago))
        paths.append(path)
    return paths


def edit(path: str) -> None:
    """The same trips in the opposite order: a plain file keeps its size, so only its
    modification time tells the change."""
    header, *trips = read_rows(path)
    write_rows(path, [header, *reversed(trips)])


def one_line_error(options: ExampleGenOptions, out) -> str:
    with pytest.raises(engine.InputError) as raised:
        engine.run(options, str(out))
    message = str(raised.value)
    assert len(message.splitlines()) == 1, message
    return message


def assert_nothing_written(out) -> None:
    """No output, and no staging folder beside where it would have been."""
    assert not out.exists()
    assert not [n for n in os.listdir(out.parent) if n.startswith(shards.STAGING_PREFIX)]


@pytest.mark.parametrize("changed", ["trips-0.csv.gz", "trips-1.csv"])
def test_a_file_changed_after_the_fingerprint_stops_example_gen_naming_it(
        taxi_csv, tmp_path, changed):
    """A file edited between the fingerprint (`run-settings`, or a local pipeline's build) and
    ExampleGen's read: the run stops before reading, in one line naming that file."""
    source = tmp_path / "source"
    paths = taxi_parts(source, taxi_csv, ("trips-0.csv.gz", "trips-1.csv"))
    settled = settle_inputs(ExampleGenOptions(source=str(source)))
    assert own_fingerprint(settled.source_fingerprint)
    path = str(source / changed)
    size = os.path.getsize(path)
    edit(path)
    if not changed.endswith(".gz"):
        assert os.path.getsize(path) == size
    assert settle_inputs(ExampleGenOptions(source=str(source))).source_fingerprint != \
        settled.source_fingerprint
    out = tmp_path / "out"
    message = one_line_error(settled, out)
    assert message.startswith(f"{path}: {CHANGED} (changed after the run took its "
                              "fingerprint); no output was committed"), message
    assert_nothing_written(out)
    # A file removed: no file is newer than the fingerprint, so the line names the source.
    settled = settle_inputs(ExampleGenOptions(source=str(source)))
    os.remove(next(p for p in paths if p != path))
    message = one_line_error(settled, out)
    assert message.startswith(f"{source}: {CHANGED} (a file was removed, or replaced by one "
                              "with an older time"), message
    assert_nothing_written(out)


@pytest.mark.parametrize("names", [("trips-0.csv.gz", "trips-1.csv"),
                                   ("trips-0.csv", "trips-1.csv.gz")],
                         ids=["gzip-changed", "plain-changed"])
def test_a_file_changed_while_example_gen_reads_it_stops_the_run_before_its_commit(
        taxi_csv, tmp_path, monkeypatch, names):
    """Unchanged files pass the check; a file edited after ExampleGen profiled it and before it
    encoded it (the first encode task waits, TFRP_INJECT_FAULT=slow-first-task, while another
    thread edits the file) stops the run in one line naming the file, and no output is
    committed, though every step ran."""
    source = tmp_path / "source"
    paths = taxi_parts(source, taxi_csv, names)
    settled = settle_inputs(ExampleGenOptions(source=str(source)))
    manifest = engine.run(settled, str(tmp_path / "unchanged"))
    assert manifest["rows_in"] == 2 * ROWS

    out = tmp_path / "out"
    monkeypatch.setenv(faults.ENVIRONMENT, f"{faults.SLOW_FIRST_TASK}=2")
    edited = threading.Event()

    def edit_while_task_0_waits() -> None:
        marker = str(tmp_path / f"{shards.STAGING_PREFIX}out-*" / faults.MARKERS /
                     "encode-slow-0")
        deadline = time.monotonic() + 120
        while not glob.glob(marker) and time.monotonic() < deadline:
            time.sleep(0.01)
        if glob.glob(marker):
            edit(paths[0])
            edited.set()

    editor = threading.Thread(target=edit_while_task_0_waits, daemon=True)
    editor.start()
    message = one_line_error(settled, out)
    editor.join()
    assert edited.is_set()
    assert message.startswith(f"{paths[0]}: {CHANGED} (changed while the run read it); "
                              "no output was committed"), message
    assert_nothing_written(out)


def test_example_gen_without_a_fingerprint_checks_nothing(taxi_csv, tmp_path):
    """`tfrp examplegen` runs unsettled options: a file edited before it runs is read as it
    is then."""
    source = tmp_path / "source"
    (path,) = taxi_parts(source, taxi_csv, ("trips.csv",))
    options = ExampleGenOptions(source=str(source))
    edit(path)
    assert engine.run(options, str(tmp_path / "out"))["rows_in"] == ROWS


@pytest.mark.pipeline
def test_a_local_pipeline_stops_when_its_source_changes_after_it_was_built(taxi_csv,
                                                                          tmp_path):
    """LocalDagRunner: the fingerprint is taken when the pipeline is built, and the executor
    checks the files against it."""
    from tfx import v1 as tfx

    from components.example_gen.component import ShardedExampleGen

    source = tmp_path / "source"
    paths = taxi_parts(source, taxi_csv, ("trips-0.csv.gz", "trips-1.csv"))
    gen = ShardedExampleGen(source=str(source))
    edit(paths[1])
    root = tmp_path / "root"
    with pytest.raises(engine.InputError) as raised:
        tfx.orchestration.LocalDagRunner().run(tfx.dsl.Pipeline(
            pipeline_name="fingerprint", pipeline_root=str(root), components=[gen],
            metadata_connection_config=tfx.orchestration.metadata
            .sqlite_metadata_connection_config(str(tmp_path / "metadata.db"))))
    assert str(raised.value).startswith(f"{paths[1]}: {CHANGED} (changed after the run took "
                                        "its fingerprint)"), raised.value
    assert not glob.glob(str(root / "**" / shards.MANIFEST_FILE), recursive=True)


VERSIONS = """
import json, sys
from tfrecord_shards import fileio
from components.example_gen.sources import locate

folder, changed = sys.argv[1], sys.argv[2]
before = locate.source_versions([folder])
fileio.write_bytes(changed, fileio.read_bytes(changed).swapcase())  # the same size
after = locate.source_versions([folder])
bucket, _, prefix = folder.split("://")[1].partition("/")
if folder.startswith("gs://"):
    from google.cloud import storage

    store = {f"gs://{bucket}/{b.name}": str(b.generation)
             for b in storage.Client().list_blobs(bucket, prefix=prefix + "/")}
else:
    import boto3

    listed = boto3.client("s3").list_objects_v2(Bucket=bucket, Prefix=prefix + "/")
    store = {f"s3://{bucket}/{o['Key']}": o["ETag"].strip('"') for o in listed["Contents"]}
print(json.dumps({"before": before, "after": after, "store": store,
                  "fingerprints": [locate.fingerprint(before), locate.fingerprint(after),
                                   locate.source_fingerprint(folder)]}))
"""
UPLOAD = """
import sys
from tfrecord_shards import fileio

for i in range(3):
    fileio.write_bytes(f"{sys.argv[1]}/part-{i}.csv", f"a,b\\n{i},x{i}\\n".encode())
"""
LISTINGS = """
import sys
from tfrecord_shards import fileio

files = fileio.file_versions([f"{sys.argv[1]}/part-{i}.csv" for i in range(3)])
below = fileio.versions_below(sys.argv[1])
assert sorted(files) == sorted(below) and len(files) == 3, (files, below)
"""


@pytest.mark.object_store
@pytest.mark.parametrize("scheme", ["gs", "s3"])
def test_a_bucket_file_replaced_by_one_of_the_same_size_changes_the_fingerprint(
        object_stores, tmp_path, scheme):
    """On gs:// the fingerprint holds each object's generation, on s3:// its ETag, as the
    store's own client lists them, so an object replaced by one of the same size (within the
    same second) changes it. The versions of a folder's files are one listing, not a request
    a file."""
    folder = f"{object_stores.make_bucket(scheme, 'tfrp-fingerprint')}/data"

    def run(code: str, *args: str) -> str:
        result = object_stores.run([sys.executable, "-c", code, *args], cwd=ROOT,
                                   env={"PYTHONWARNINGS": "ignore"}, timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
        return result.stdout

    run(UPLOAD, folder)
    object_stores.reset_counts()
    run(LISTINGS, folder)
    requests = (object_stores.gcs_requests() if scheme == "gs"
                else object_stores.s3_requests())
    assert requests.get("total") == 2, requests  # file_versions' listing, versions_below's
    changed = f"{folder}/part-1.csv"
    found = json.loads(run(VERSIONS, folder, changed))
    before, after, store = found["before"], found["after"], found["store"]
    assert sorted(before) == sorted(store) == [f"{folder}/part-{i}.csv" for i in range(3)]
    assert after[changed][0] == before[changed][0]  # the same size
    assert after[changed][1] != before[changed][1]
    assert {path: version for path, (_, version, _) in after.items()} == store
    assert {p: v for p, v in after.items() if p != changed} == \
        {p: v for p, v in before.items() if p != changed}
    first, second, settled = found["fingerprints"]
    assert second != first and settled == second


NO_BOTO3 = """
import json, sys
sys.modules["boto3"] = None  # as in the image, which installs no dev-only package
from tfrecord_shards import fileio
from components.example_gen.sources import locate

below = fileio.versions_below(sys.argv[1])
print(json.dumps({"below": below, "files": fileio.file_versions(sorted(below)),
                  "fingerprint": locate.source_fingerprint(sys.argv[1])}))
"""


@pytest.mark.object_store
def test_without_boto3_an_s3_fingerprint_holds_pyarrows_sizes_and_times(object_stores):
    """The image has no boto3: there an s3:// source's fingerprint falls back to the sizes
    and modification times pyarrow lists, the same whether a folder or its files are asked
    for."""
    folder = f"{object_stores.make_bucket('s3', 'tfrp-fingerprint-no-boto3')}/data"
    for code, args in ((UPLOAD, (folder,)), (NO_BOTO3, (folder,))):
        result = object_stores.run([sys.executable, "-c", code, *args], cwd=ROOT,
                                   env={"PYTHONWARNINGS": "ignore"}, timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout)
    assert found["below"] == found["files"]
    assert sorted(found["below"]) == [f"{folder}/part-{i}.csv" for i in range(3)]
    for size, version, written_ns in found["below"].values():
        assert size == len("a,b\n0,x0\n") and version == str(written_ns) and written_ns > 0
    assert own_fingerprint(found["fingerprint"])


@pytest.mark.spark
def test_the_spark_engine_stops_on_a_changed_file_as_the_beam_job_does(taxi_csv, tmp_path):
    """ExampleGen on Spark (`engine: spark`) runs the same check around its read."""
    source = tmp_path / "source"
    taxi_parts(source, taxi_csv, ("trips-0.csv.gz", "trips-1.csv"))
    settled = settle_inputs(ExampleGenOptions(source=str(source), engine="spark",
                                              spark_master="local[1]"))
    edit(str(source / "trips-1.csv"))
    out = tmp_path / "out"
    message = one_line_error(settled, out)
    assert message.startswith(f"{source / 'trips-1.csv'}: {CHANGED} (changed after the run "
                              "took its fingerprint)"), message
    assert_nothing_written(out)
