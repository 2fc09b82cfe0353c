"""Spark on local[2]: DataFrames to our shard layout and back, with no JVM jar.

These tests need Java. Without it they fail with the one-line install hint; they are not
skipped."""
from __future__ import annotations

import dataclasses
import datetime
import decimal
import glob
import json
import logging
import os

import pandas as pd
import pytest
import tensorflow as tf

from tfrecord_shards import example_rows, shards, tfrecord_io
from tfrecord_shards.codec import parser, schema_file, serializer
from components.example_gen import beam_job
from components.example_gen.options import ExampleGenOptions
from spark_shards import session as spark_session
from components.example_gen import spark_job
from spark_shards.columns import UnsupportedColumnError
from spark_shards.read import file_groups, read_examples
from components.example_gen.spark_write import write_examples
from conftest import tfrp

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def spark():
    session = spark_session.get_session("local[2]")
    yield session
    session.stop()


def all_types_frame(spark, rows: int = 600):
    from pyspark.sql import types as T

    schema = T.StructType([
        T.StructField("id", T.LongType()), T.StructField("small", T.IntegerType()),
        T.StructField("tiny", T.ByteType()), T.StructField("ratio", T.FloatType()),
        T.StructField("score", T.DoubleType()), T.StructField("word", T.StringType()),
        T.StructField("blob", T.BinaryType()), T.StructField("flag", T.BooleanType()),
        T.StructField("day", T.DateType()), T.StructField("at", T.TimestampType()),
        T.StructField("price", T.DecimalType(10, 2)),
        T.StructField("tags", T.ArrayType(T.StringType())),
        T.StructField("nums", T.ArrayType(T.LongType())),
        T.StructField("trip", T.StructType([T.StructField("miles", T.DoubleType()),
                                            T.StructField("mode", T.StringType())])),
    ])
    data = []
    for k in range(rows):
        data.append((
            k, k % 1000, k % 100, k / 4, k / 3, f"w{k % 5}", bytes([k % 256, 0xff, 0xfe]),
            k % 2 == 0, datetime.date(1970, 1, 1) + datetime.timedelta(days=k),
            datetime.datetime(2021, 3, 4, 5, 6, 7, k, tzinfo=datetime.timezone.utc),
            decimal.Decimal(k) / 4, [f"t{j}" for j in range(k % 3)], list(range(k % 4)),
            (k / 10, "walk" if k % 2 else None)))
    if rows > 7:
        data[7] = (7,) + (None,) * 13  # every other value missing
    return spark.createDataFrame(data, schema).repartition(3)


def test_java_missing_is_one_line_saying_how_to_install_it(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(spark_session.SparkSetupError) as error:
        spark_session.check_java()
    assert "\n" not in str(error.value)
    assert "apt-get install -y openjdk-17-jre-headless" in str(error.value)


JVM_BESIDE_BUSY_GRPC = """
import os, signal, subprocess, sys, threading
from concurrent import futures
import grpc

server = grpc.server(futures.ThreadPoolExecutor(4))
server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("echo", {
    "Echo": grpc.unary_unary_rpc_method_handler(lambda request, _: request)})])
port = server.add_insecure_port("127.0.0.1:0")
server.start()
calling = threading.Event()

def call_forever():
    echo = grpc.insecure_channel(f"127.0.0.1:{port}").unary_unary("/echo/Echo")
    while True:
        echo(b"x")
        calling.set()

for _ in range(3):
    threading.Thread(target=call_forever, daemon=True).start()
calling.wait()
# The control: a child started with a preexec_fn is forked with gRPC's fork handlers, which
# say so when a call is in flight (about 29 times in 30 here, so five tries). Such a child
# may even die before it execs (SIGABRT, seen once in a suite run): what broke the JVM.
crashed = sum(subprocess.run(["true"], preexec_fn=lambda: None).returncode != 0
              for _ in range(5))
print("control children that died", crashed)
sys.stderr.write("CONTROL DONE\\n")
sys.stderr.flush()
from spark_shards.session import get_session

spark = get_session("local[1]")
assert spark.range(10).count() == 10
java = subprocess.run(["pgrep", "-P", str(os.getpid()), "java"], capture_output=True,
                      text=True).stdout.split()
status = open(f"/proc/{java[0]}/status").read()
ignored = int(next(l for l in status.splitlines() if l.startswith("SigIgn")).split()[1], 16)
print("SIGINT ignored", bool(ignored & (1 << (signal.SIGINT - 1))),
      "same group", os.getpgid(int(java[0])) == os.getpgid(0))
os._exit(0)
"""


def test_the_jvm_starts_without_forking_beside_threads_in_grpc():
    """pyspark's own start forks (its preexec_fn), and in a process with threads inside gRPC
    (a TFX or Beam run) gRPC's fork handlers then run in the child, which once broke the
    JVM's start twice in a row. Ours starts it with no fork handlers (the control, a forked
    child, shows that they would run), still ignoring SIGINT and in this process's group."""
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-c", JVM_BESIDE_BUSY_GRPC], capture_output=True, text=True,
        timeout=300, env={**os.environ, "GRPC_VERBOSITY": "INFO"})
    assert result.returncode == 0, result.stderr[-3000:]
    control, _, after = result.stderr.partition("CONTROL DONE")
    assert "fork() handlers" in control, result.stderr[-3000:]
    assert "fork() handlers" not in after, after[-3000:]
    assert "SIGINT ignored True same group True" in result.stdout


def test_executors_encode_and_decode_without_importing_tensorflow(spark, taxi_slice_dir,
                                                                   tmp_path):
    from components.example_gen import spark_job

    write_examples(all_types_frame(spark, rows=50), str(tmp_path / "out"))
    spark_job.run(ExampleGenOptions(source=os.path.join(taxi_slice_dir, "data.csv")),
                        str(tmp_path / "gen"), spark=spark)
    assert read_examples(spark, str(tmp_path / "out")).count() == 50  # lists and scalars
    assert read_examples(spark, str(tmp_path / "gen")).count() == 2000  # scalars

    def tensorflow_loaded(_):
        import sys

        return "tensorflow" in sys.modules

    # Python workers are reused across tasks, so the workers that wrote and read answer.
    answers = spark.sparkContext.parallelize(range(4), 4).map(tensorflow_loaded).collect()
    assert answers == [False] * 4


def test_write_examples_writes_our_layout_with_every_type(spark, tmp_path):
    out = str(tmp_path / "out")
    manifest = write_examples(all_types_frame(spark), out, num_shards=2)
    assert manifest["rows_in"] == manifest["rows_written"] == 600
    assert manifest["rows_quarantined"] == 0
    for split in ("train", "eval"):
        assert sorted(os.listdir(os.path.join(out, f"Split-{split}"))) == [
            f"data_tfrecord-0000{i}-of-00002.gz" for i in range(2)]
    in_shards = sum(tfrecord_io.count_records(os.path.join(out, s["path"]))
                    for split in manifest["splits"].values() for s in split["shards"])
    assert in_shards == 600
    assert all(s.get("gzip_members") for split in manifest["splits"].values()
               for s in split["shards"])
    schema = schema_file.load_schema(os.path.join(out, "schema.pbtxt"))
    features = {f.name: f for f in schema.feature}
    assert list(features) == ["id", "small", "tiny", "ratio", "score", "word", "blob", "flag",
                              "day", "at", "price", "tags", "nums", "trip.miles", "trip.mode"]
    # Dates and timestamps are epoch seconds, as from every other source.
    for name in ("day", "at"):
        assert serializer.TIME_TAG in features[name].annotation.tag
        assert features[name].annotation.comment[0] == serializer.TIME_COMMENT
    assert "DecimalType" in features["price"].annotation.comment[0]
    assert parser.is_scalar(features["id"]) and not parser.is_scalar(features["tags"])

    # TensorFlow's own parser reads the shards.
    spec = {name: tf.io.FixedLenFeature([], tf.int64, default_value=-1)
            for name in ("id", "day", "at")}
    files = glob.glob(os.path.join(out, "Split-*", "*.gz"))
    parsed = {}
    for batch in tf.data.TFRecordDataset(files, compression_type="GZIP").batch(1000).map(
            lambda records: tf.io.parse_example(records, spec)):
        for key, value in batch.items():
            parsed.setdefault(key, []).append(value)
    ids = tf.concat(parsed["id"], 0).numpy()
    days = tf.concat(parsed["day"], 0).numpy()
    at = tf.concat(parsed["at"], 0).numpy()
    row = int(list(ids).index(10))
    assert days[row] == 10 * 86_400
    assert at[row] == int(datetime.datetime(2021, 3, 4, 5, 6, 7,
                                            tzinfo=datetime.timezone.utc).timestamp())


def test_read_examples_round_trips_what_write_examples_wrote(spark, tmp_path):
    frame = all_types_frame(spark)
    out = str(tmp_path / "out")
    write_examples(frame, out, compression="none", shard_size_mb=1)
    back = {row["id"]: row for row in read_examples(spark, out).collect()}
    assert len(back) == 600
    types = dict(read_examples(spark, out).dtypes)
    assert types["blob"] == "binary" and types["word"] == "string"
    assert types["tags"] == "array<string>" and types["nums"] == "array<bigint>"
    for original in frame.collect():
        row = back[original["id"]]
        if original["id"] == 7:
            assert row["word"] is None and row["blob"] is None and row["day"] is None
            assert row["trip.miles"] is None
            continue
        assert bytes(row["blob"]) == bytes(original["blob"])  # non-UTF-8 bytes kept
        assert row["word"] == original["word"] and row["flag"] == int(original["flag"])
        assert row["day"] == (original["day"] - datetime.date(1970, 1, 1)).days * 86_400
        assert row["price"] == pytest.approx(float(original["price"]))
        assert row["score"] == pytest.approx(original["score"], rel=1e-6)
        assert list(row["tags"]) == original["tags"] and list(row["nums"]) == original["nums"]
        assert row["trip.miles"] == pytest.approx(original["trip"]["miles"], rel=1e-6)
        assert row["trip.mode"] == original["trip"]["mode"]


def test_maps_and_arrays_of_structs_are_errors_naming_the_column(spark, tmp_path):
    from pyspark.sql import types as T

    with_map = spark.createDataFrame([(1, {"a": 1})], T.StructType([
        T.StructField("id", T.LongType()),
        T.StructField("attrs", T.MapType(T.StringType(), T.LongType()))]))
    with pytest.raises(UnsupportedColumnError, match="column 'attrs' is a map"):
        write_examples(with_map, str(tmp_path / "a"))
    nested = spark.createDataFrame([(1, [(1, "x")])], T.StructType([
        T.StructField("id", T.LongType()),
        T.StructField("stops", T.ArrayType(T.StructType([
            T.StructField("n", T.LongType()), T.StructField("name", T.StringType())])))]))
    with pytest.raises(UnsupportedColumnError, match="column 'stops' is an array of structs"):
        write_examples(nested, str(tmp_path / "b"))
    assert not os.path.exists(tmp_path / "a" / shards.MANIFEST_FILE)


def test_a_row_lands_in_the_same_split_whichever_engine_wrote_it(spark, taxi_csv, tmp_path):
    parquet = str(tmp_path / "taxi.parquet")
    spark.createDataFrame(pd.read_csv(taxi_csv).head(3000)).repartition(4) \
        .write.parquet(parquet)
    beam_out, spark_out = str(tmp_path / "beam"), str(tmp_path / "spark")
    beam_job.run(ExampleGenOptions(source=parquet, format="parquet"), beam_out)
    write_examples(spark.read.parquet(parquet), spark_out)
    for split in ("train", "eval"):
        def records(out):
            return sorted(record for shard in glob.glob(os.path.join(out, f"Split-{split}", "*"))
                          for _, record in tfrecord_io.iter_records(shard))
        beam_records, spark_records = records(beam_out), records(spark_out)
        assert len(beam_records) > 500
        assert beam_records == spark_records  # the same rows, byte for byte
    assert open(os.path.join(beam_out, "schema.pbtxt")).read() == \
        open(os.path.join(spark_out, "schema.pbtxt")).read()


def test_partition_folders_come_back_as_a_column(spark, tmp_path):
    frame = all_types_frame(spark, rows=90)
    out = str(tmp_path / "out")
    write_examples(frame, out, partition_by="word", splits="all:1")
    assert set(os.listdir(out)) == {"manifest.json", "schema.pbtxt", "word=__null__"} | {
        f"word=w{i}" for i in range(5)}
    back = read_examples(spark, out)
    assert back.count() == 90
    for row in back.select("id", "word").collect():
        assert row["word"] == (None if row["id"] == 7 else f"w{row['id'] % 5}")
    # Folders named like Spark's partitions, over data that lacks the column, add it.
    data = tmp_path / "data"
    for region, rows in (("north", frame.where("id < 45")), ("south", frame.where("id >= 45"))):
        write_examples(rows.drop("word"), str(data / f"region={region}"), splits="all:1")
    back = read_examples(spark, str(data))
    assert back.columns[-1] == "region"
    regions = {row["id"]: row["region"] for row in back.select("id", "region").collect()}
    assert regions == {i: "north" if i < 45 else "south" for i in range(90)}


def test_reads_packed_transform_output_and_stock_example_gen(spark, stock_taxi_examples,
                                                            tmp_path):
    stock, stock_schema = stock_taxi_examples
    stock_rows = read_examples(spark, stock, schema=stock_schema)
    assert stock_rows.count() == 2000
    assert dict(stock_rows.dtypes)["fare"] == "float"
    # Without a schema, types are inferred from a sample; bytes stay binary.
    inferred = read_examples(spark, os.path.join(stock, "Split-train"))
    assert dict(inferred.dtypes)["payment_type"] == "binary"

    from tfrecord_shards import packing
    from tfrecord_shards.packing.write import pack_batch
    import pyarrow as pa

    schema = schema_file.load_schema(stock_schema)
    table = pa.table({"fare": pa.array([float(i) for i in range(2500)], pa.float32()),
                      "trip_start_hour": pa.array(list(range(2500)), pa.int64())})
    row_schema = type(schema)()
    row_schema.CopyFrom(schema)
    del row_schema.feature[:]
    for name in ("fare", "trip_start_hour"):
        feature = row_schema.feature.add()
        feature.CopyFrom(next(f for f in schema.feature if f.name == name))
        feature.ClearField("presence")
        feature.presence.min_fraction = 1.0
        feature.ClearField("value_count")
        feature.ClearField("shape")
        feature.shape.dim.add(size=1)
    blocks = pack_batch(table, packing.PackedLayout.from_schema(
        packing.annotate(row_schema, 1024)))
    folder = tmp_path / "packed" / "Split-train"
    folder.mkdir(parents=True)
    with tf.io.TFRecordWriter(str(folder / "data_tfrecord-00000-of-00001")) as writer:
        for block in blocks:
            writer.write(block)
    schema_file.write_schema(packing.annotate(row_schema, 1024),
                             str(tmp_path / "packed" / "schema.pbtxt"))
    rows = read_examples(spark, str(tmp_path / "packed")).collect()
    assert len(rows) == 2500  # three blocks, the last one short
    assert sorted(r["trip_start_hour"] for r in rows) == list(range(2500))
    assert all(r["fare"] == float(r["trip_start_hour"]) for r in rows)


def test_read_tasks_take_every_file_once_in_groups_of_about_equal_bytes(tmp_path):
    sizes = [900, 500, 500, 400, 300, 300, 200, 100, 0]
    files = []
    for i, size in enumerate(sizes):
        files.append(str(tmp_path / f"data_tfrecord-{i:05d}"))
        with open(files[-1], "wb") as f:
            f.write(b"x" * size)
    for cores in (1, 2, 3, 20):
        groups = file_groups(files, cores)
        assert len(groups) == min(cores, len(files))
        assert sorted(f for g in groups for f in g) == sorted(files)
        loads = [sum(os.path.getsize(f) for f in g) for g in groups]
        assert max(loads) - min(loads) <= max(sizes)
    assert [sum(os.path.getsize(f) for f in g) for g in file_groups(files, 2)] == [1600, 1600]


@pytest.mark.parametrize("compression", ["gzip", "none"])
def test_a_corrupt_record_is_an_error_naming_the_file_and_offset(spark, tmp_path, compression):
    out = str(tmp_path / "out")
    frame = all_types_frame(spark, rows=200)
    write_examples(frame, out, compression=compression, splits="all:1", num_shards=1)
    shard = glob.glob(os.path.join(out, "Split-all", "*"))[0]
    with open(shard, "r+b") as f:
        f.seek(os.path.getsize(shard) // 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xff]))
    with pytest.raises(Exception) as error:
        read_examples(spark, out).collect()
    assert f"{shard}: corrupt TFRecord at byte offset" in str(error.value)


def test_examplegen_engine_spark_writes_what_the_beam_job_writes(taxi_slice_dir,
                                                                  taxi_examples, tmp_path):
    out = str(tmp_path / "spark")
    result = tfrp("examplegen", os.path.join(taxi_slice_dir, "data.csv"), out,
                  "--engine", "spark", "--spark-master", "local[2]",
                  "--spark-conf", "spark.sql.shuffle.partitions=4")
    assert "train: " in result.stdout
    for name in ("schema.pbtxt",) + tuple(
            os.path.relpath(p, taxi_examples)
            for p in glob.glob(os.path.join(taxi_examples, "Split-*", "*"))):
        with open(os.path.join(out, name), "rb") as ours, \
                open(os.path.join(taxi_examples, name), "rb") as beams:
            assert ours.read() == beams.read(), name


MIXED_CSV = ("id,,day,at,mixed,name,name\n"
             "1,x,2007-11-11,2013-01-01T10:00:00Z,2007-11-11,NA,\"NA\"\n"
             "2,y,1969-12-31,2013-01-01T12:00:00+02:00,cab,b,c\n"
             "3,,NA,2013-06-01T00:00:00Z,,\"\",d\n")


@pytest.mark.parametrize("data", ["csv", "dataframe"])
def test_dates_times_nulls_and_header_names_come_out_alike_from_both_engines(
        spark, data, tmp_path):
    """The same table through Spark and Beam gives the same rows and schema: dates and
    times as epoch seconds, null spellings as nulls, stable names for an empty and a
    repeated header cell."""
    source = tmp_path / "mixed.csv"
    source.write_text(MIXED_CSV)
    beam_out = tmp_path / "beam"
    beam_job.run(ExampleGenOptions(source=str(source), splits="all:1"), str(beam_out))
    spark_out = str(tmp_path / "spark")
    if data == "csv":
        spark_job.run(ExampleGenOptions(source=str(source), splits="all:1",
                                              engine="spark"), spark_out, spark=spark)
    else:
        import datetime

        frame = spark.createDataFrame(
            [(1, datetime.date(2007, 11, 11),
              datetime.datetime(2013, 1, 1, 10, tzinfo=datetime.timezone.utc)),
             (2, datetime.date(1969, 12, 31),
              datetime.datetime(2013, 1, 1, 10, tzinfo=datetime.timezone.utc)),
             (3, None, datetime.datetime(2013, 6, 1, tzinfo=datetime.timezone.utc))],
            "id long, day date, at timestamp")
        write_examples(frame, spark_out, splits="all:1")

    def rows(folder):
        return {row["id"]: row for row in example_rows.iter_rows(str(folder))}

    ours, beams = rows(spark_out), rows(beam_out)
    columns = ["id", "day", "at"] if data == "dataframe" else list(beams[1])
    assert {i: {c: r[c] for c in columns} for i, r in ours.items()} == \
        {i: {c: r[c] for c in columns} for i, r in beams.items()}
    assert beams[1]["day"] == 1194739200 and beams[2]["day"] == -86_400
    assert beams[3]["day"] is None
    assert beams[1]["at"] == beams[2]["at"] == 1357034400
    if data == "csv":
        assert list(beams[1]) == ["id", "column_2", "day", "at", "mixed", "name", "name_2"]
        assert (beams[1]["name"], beams[1]["name_2"]) == (None, b"NA")
        assert beams[3]["name"] == b"" and beams[3]["column_2"] is None
    tagged = {f.name for f in schema_file.load_schema(spark_out).feature
              if serializer.TIME_TAG in f.annotation.tag}
    assert tagged == {"day", "at"}


def test_examplegen_engine_spark_names_a_bad_row_in_one_line(taxi_slice_dir, tmp_path):
    source = tmp_path / "bad.csv"
    with open(os.path.join(taxi_slice_dir, "data.csv")) as f:
        lines = f.readlines()[:300]
    lines[120] = lines[120].rstrip("\n") + ",extra\n"
    source.write_text("".join(lines))
    result = tfrp("examplegen", str(source), str(tmp_path / "out"), "--engine", "spark",
                  "--spark-master", "local[2]", check=False)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"Error: {source}: row 121: expected 18 fields, got 19: 1 more than the header has "
        "(a delimiter inside an unquoted value?)")
    assert not os.path.exists(tmp_path / "out" / shards.MANIFEST_FILE)


def test_the_kubeflow_compile_carries_the_spark_engine(tmp_path):
    """The whole pipeline with ExampleGen on Spark runs in tests/test_gate.py."""
    settings = tmp_path / "spark.yaml"
    settings.write_text("engine: spark\nspark_master: spark://sparkhost:7077\n"
                        "spark_conf:\n  spark.executor.memory: 4g\n")
    output = tmp_path / "pipeline.json"
    tfrp("compile", "--target", "kubeflow", "--output", str(output), "--config", str(settings))
    spec = json.loads(output.read_text())
    # ExampleGen's options reach it through the run-settings task, which settles them.
    compiled = spec["root"]["dag"]["tasks"]["run-settings"]["inputs"]["parameters"][
        "ShardedExampleGen-options_json"]
    example_gen = json.loads(compiled["runtimeValue"]["constant"])
    assert example_gen["engine"] == "spark"
    assert example_gen["spark_master"] == "spark://sparkhost:7077"
    assert example_gen["spark_conf"] == {"spark.executor.memory": "4g"}
    transform_args = spec["deploymentSpec"]["executors"]["ShardedTransform_executor"][
        "container"]["args"]
    assert "--runner=DirectRunner" in transform_args  # the other components keep Beam


def test_empty_partitions_write_and_read_back(spark, tmp_path):
    frame = all_types_frame(spark, rows=5).repartition(8)  # most partitions are empty
    out = str(tmp_path / "out")
    manifest = write_examples(frame, out)
    assert manifest["rows_in"] == manifest["rows_written"] == 5
    assert sorted(r["id"] for r in read_examples(spark, out).collect()) == list(range(5))


def test_hostile_partition_values_stay_inside_the_output(spark, tmp_path):
    values = ["../x", "a/b", "..", "", None, "__null__", "ok"]
    frame = spark.createDataFrame([(i, v) for i, v in enumerate(values)], "id long, key string")
    out = tmp_path / "out"
    write_examples(frame, str(out), partition_by="key", splits="all:1")
    inside = os.path.realpath(out)
    for root, dirs, files in os.walk(out):
        for name in dirs + files:
            assert os.path.realpath(os.path.join(root, name)).startswith(inside + os.sep)
    assert len([d for d in os.listdir(out) if d.startswith("key=")]) == len(values)
    back = {r["id"]: r["key"] for r in read_examples(spark, str(out)).collect()}
    assert back == dict(enumerate(values))


def test_a_task_that_fails_mid_write_leaves_nothing_that_looks_complete(spark, tmp_path):
    from pyspark.sql import functions as F

    @F.udf("long")
    def explode_at_500(value):
        if value == 500:
            raise RuntimeError("a task dies here")
        return value

    frame = spark.range(0, 1000, numPartitions=2).select(explode_at_500("id").alias("id"))
    out = tmp_path / "out"
    with pytest.raises(Exception, match="a task dies here"):
        write_examples(frame, str(out))
    assert not os.path.exists(out / shards.MANIFEST_FILE)
    assert not glob.glob(str(out / "Split-*"))
    assert not os.path.exists(out) or os.listdir(out) == []


def test_quoted_line_breaks_at_block_boundaries_come_out_whole_from_spark(spark, tmp_path):
    """The Spark engine's tasks read CSV as the Beam job does: CR, LF and CRLF inside quoted
    cells, one of each astride a read block boundary, each row once with its text."""
    from test_example_gen import line_break_folder

    texts = line_break_folder(tmp_path / "breaks")
    manifest = spark_job.run(ExampleGenOptions(source=str(tmp_path / "breaks"),
                                               splits="all:1", engine="spark"),
                             str(tmp_path / "out"), spark=spark)
    assert manifest["rows_in"] == manifest["rows_written"] == len(texts)
    rows = list(example_rows.iter_rows(str(tmp_path / "out")))
    assert sorted(r["id"] for r in rows) == sorted(texts)
    assert {r["id"]: r["text"].decode() for r in rows} == texts


def _examples_bytes(folder) -> dict[str, bytes]:
    """The schema and every shard of an ExampleGen output, by path inside it."""
    names = ["schema.pbtxt"] + [os.path.relpath(p, folder)
                                for p in glob.glob(os.path.join(folder, "Split-*", "*"))]
    found = {}
    for name in names:
        with open(os.path.join(folder, name), "rb") as f:
            found[name] = f.read()
    return found


def _spark_jobs(spark, run) -> int:
    """How many Spark jobs `run()` started."""
    import uuid

    context = spark.sparkContext
    group = f"examplegen-{uuid.uuid4().hex}"
    context.setJobGroup(group, "ExampleGen in a test")
    try:
        run()
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)
    return len(context.statusTracker().getJobIdsForGroup(group))


@pytest.mark.parametrize("widened", [False, True])
def test_the_spark_engine_reads_a_csv_file_once_and_writes_what_beam_writes(
        spark, taxi_csv, tmp_path, monkeypatch, widened):
    """The Spark engine profiles and encodes a CSV file in the same task, as the Beam job
    does: one Spark job fewer than the two passes (a profile job, an encode job), the same
    shards and schema as the Beam job and as the two passes. Widened: the first file holds
    the sample three times (more than one 4 MiB read block), its tips whole dollars but in
    the last copy, so its task begins it again; the second file's fares are whole dollars,
    so the merged profile's float fares have it encoded again (a job of its own)."""
    import csv
    import dataclasses

    from components.example_gen.sources import registry

    with open(taxi_csv, encoding="utf-8", newline="") as f:
        header, *rows = list(csv.reader(f))
    source = tmp_path / "source"
    source.mkdir()
    if widened:
        tips, fare = header.index("tips"), header.index("fare")

        def whole(row, column):
            return row[:column] + [str(round(float(row[column])))] + row[column + 1:] \
                if row[column] else row

        parts = ([whole(row, tips) for row in rows] * 2 + rows,
                 [whole(row, fare) for row in rows[:3000]])
    else:
        parts = (rows,)
    for index, part in enumerate(parts):
        with open(source / f"part-{index}.csv", "w", encoding="utf-8", newline="") as f:
            csv.writer(f, lineterminator="\n").writerows([header] + part)
    if widened:
        assert os.path.getsize(source / "part-0.csv") > 4 << 20
    options = ExampleGenOptions(source=str(source), engine="spark")
    one_read_jobs = _spark_jobs(spark, lambda: spark_job.run(
        options, str(tmp_path / "one_read"), spark=spark))
    with monkeypatch.context() as patch:
        patch.setitem(registry.FORMATS, "csv",
                      dataclasses.replace(registry.FORMATS["csv"], read_inferring=None))
        two_pass_jobs = _spark_jobs(spark, lambda: spark_job.run(
            options, str(tmp_path / "two_pass"), spark=spark))
    beam_job.run(dataclasses.replace(options, engine="beam"), str(tmp_path / "beam"))
    one_read = _examples_bytes(tmp_path / "one_read")
    assert one_read == _examples_bytes(tmp_path / "two_pass") == \
        _examples_bytes(tmp_path / "beam")
    assert sum(n.startswith("Split-train") for n in one_read) >= 1
    manifest = shards.read_manifest(str(tmp_path / "one_read"))
    assert manifest["rows_written"] == manifest["rows_in"] == sum(len(p) for p in parts)
    assert one_read_jobs == two_pass_jobs - (0 if widened else 1)


def test_the_spark_engine_reads_a_large_csv_in_byte_ranges_as_beam_reads_it_whole(
        spark, tmp_path, caplog):
    """A CSV with quoted line breaks, cut every 32 KiB into tasks that each find their own
    records (`csv_ranges`): the shards and schema the Beam job writes from the whole file,
    and one entry for the file in the manifest."""
    from testsupport.data import tweets_like

    source = tmp_path / "tweets.csv"
    tweets_like(source, rows=2000)
    caplog.set_level(logging.INFO)
    options = ExampleGenOptions(source=str(source), engine="spark", piece_bytes=32 << 10)
    manifest = spark_job.run(options, str(tmp_path / "spark"), spark=spark)
    ranges = -(-os.path.getsize(source) // (32 << 10))
    assert f"reading {ranges} byte ranges of large files" in caplog.text and ranges > 4
    beam_job.run(dataclasses.replace(options, engine="beam"), str(tmp_path / "beam"))
    # The same records in the same shards and order (the gzip members follow the batches
    # each task read, so the files' bytes differ), and the same schema.
    spark_records, beam_records = (
        {os.path.relpath(p, folder): list(tfrecord_io.iter_records(p))
         for p in sorted(glob.glob(os.path.join(folder, "Split-*", "*")))}
        for folder in (tmp_path / "spark", tmp_path / "beam"))
    assert spark_records == beam_records and len(spark_records) == 2
    assert (tmp_path / "spark" / "schema.pbtxt").read_bytes() == \
        (tmp_path / "beam" / "schema.pbtxt").read_bytes()
    assert [(s["rows_in"], s["ranges"]) for s in manifest["sources"]] == [(2000, ranges)]
    assert manifest["rows_written"] == 2000
