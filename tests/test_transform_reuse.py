"""ShardedTransform's columnar path applies the transform to the batches its analysis decoded
(kept as Arrow IPC files in the run's staging folder, `reuse_decoded`) instead of decoding
the analysed split a second time: the same rows, values and TransformGraph as decoding
twice, every row accounted for, and no kept copy left behind, whether the run succeeds or
fails."""
from __future__ import annotations

import glob
import os

import pytest

from components.transform import beam_job, columnar_job, taxi
from components.transform.inputs import ArrowCopy, kept_batches, record_batches, split_paths
from components.transform.options import TransformOptions
from tfrecord_shards import tfrecord_io
from tfrecord_shards.codec import parser, schema_file
from tfrecord_shards.shards import ShardingOptions


def leftovers(folder) -> list[str]:
    """Kept copies (whole or partial) anywhere below `folder`, hidden folders included."""
    return [os.path.join(top, name) for top, _, names in os.walk(folder) for name in names
            if name.endswith((".arrow", ".partial"))]


@pytest.fixture(scope="module", params=["gzip", "none"])
def examples(request, taxi_csv, tmp_path_factory) -> str:
    """The taxi sample through our ExampleGen, three shards a split (several files, so
    several kept copies), gzip and plain."""
    from components.example_gen import beam_job as example_gen
    from components.example_gen.options import ExampleGenOptions

    out = str(tmp_path_factory.mktemp(f"examples-{request.param}") / "examples")
    example_gen.run(ExampleGenOptions(source=taxi_csv, sharding=ShardingOptions(
        compression=request.param, num_shards=3)), out)
    return out


def counting_decodes(monkeypatch) -> list[int]:
    """Rows the columnar path decodes from tf.Examples, counted as they are decoded."""
    decoded = []

    def counted(path, schema, keep=None):
        for batch in record_batches(path, schema, keep):
            decoded.append(batch.num_rows)
            yield batch

    monkeypatch.setattr(columnar_job, "record_batches", counted)
    return decoded


def transform(examples: str, out, reuse: bool) -> dict:
    options = TransformOptions(preprocessing_fn=taxi.PREPROCESSING_FN, packed_rows=0,
                               reuse_decoded=reuse)
    return beam_job.run(options, examples, parser.active_schema(
        schema_file.load_schema(examples)), str(out / "graph"), str(out / "examples"))


def records(examples: str, split: str) -> list[bytes]:
    return sorted(record for path in split_paths(examples, split)
                  for record in tfrecord_io.iter_records(path))


def test_default_reuses_the_decoded_batches():
    assert TransformOptions().reuse_decoded is True


def test_reused_batches_give_the_rows_values_and_graph_of_decoding_twice(
        examples, tmp_path, monkeypatch):
    from test_transform_beam import graph_constants

    source = beam_job.shards.read_manifest(examples)
    rows = {split: entry["rows"] for split, entry in source["splits"].items()}
    decoded = counting_decodes(monkeypatch)
    twice = transform(examples, tmp_path / "twice", reuse=False)
    assert sum(decoded) == 2 * rows["train"] + rows["eval"]
    decoded.clear()
    once = transform(examples, tmp_path / "once", reuse=True)
    # The train split decoded once, by the analysis; the transform read the kept copies.
    assert sum(decoded) == rows["train"] + rows["eval"]

    for manifest in (twice, once):
        assert manifest["rows_in"] == manifest["rows_written"] == sum(rows.values())
        assert {s: e["rows"] for s, e in manifest["splits"].items()} == rows
    for split in rows:
        assert records(str(tmp_path / "once" / "examples"), split) == \
            records(str(tmp_path / "twice" / "examples"), split), split
    assert graph_constants(str(tmp_path / "once" / "graph")) == \
        graph_constants(str(tmp_path / "twice" / "graph"))
    for name in ("transformed_metadata/*", "transform_fn/assets/*"):
        files = {side: {os.path.relpath(f, tmp_path / side): open(f, "rb").read()
                        for f in glob.glob(str(tmp_path / side / "graph" / name))}
                 for side in ("once", "twice")}
        assert files["once"] and files["once"] == files["twice"], name
    assert leftovers(tmp_path) == []
    assert [n for n in os.listdir(tmp_path / "once") if n.startswith(".")] == []


def test_each_copy_is_removed_once_read_and_a_retried_piece_decodes_its_file(
        examples, tmp_path, monkeypatch):
    source = beam_job.shards.read_manifest(examples)
    rows = {split: entry["rows"] for split, entry in source["splits"].items()}
    read = []
    real_kept_batches = columnar_job.kept_batches

    def tracked(path):
        assert not any(os.path.exists(p) for p in read)  # the copies read before: gone
        read.append(path)
        return real_kept_batches(path)

    real_process = columnar_job._TransformFile.process

    def retried(self, element):
        # A runner retrying every piece: the first attempt's outputs are dropped.
        for _ in real_process(self, element):
            pass
        yield from real_process(self, element)

    monkeypatch.setattr(columnar_job, "kept_batches", tracked)
    monkeypatch.setattr(columnar_job._TransformFile, "process", retried)
    decoded = counting_decodes(monkeypatch)
    manifest = transform(examples, tmp_path / "retried", reuse=True)
    assert len(read) == 3  # each train copy read once, by the first attempt
    # The analysis decoded the train split; the retries decoded it again, and eval twice.
    assert sum(decoded) == 2 * rows["train"] + 2 * rows["eval"]
    assert manifest["rows_written"] == sum(rows.values())
    monkeypatch.undo()
    transform(examples, tmp_path / "once", reuse=True)
    for split in rows:
        assert records(str(tmp_path / "retried" / "examples"), split) == \
            records(str(tmp_path / "once" / "examples"), split), split
    assert leftovers(tmp_path) == []


def test_a_failed_transform_leaves_no_kept_copies_and_no_complete_output(
        examples, tmp_path, monkeypatch):
    from components.transform.encoding import SplitEncoder

    def fail(self, batch):
        raise RuntimeError("the encoder failed")

    made = []
    real_enter = ArrowCopy.__enter__

    def tracked(self):
        made.append(self.path)
        return real_enter(self)

    monkeypatch.setattr(ArrowCopy, "__enter__", tracked)
    monkeypatch.setattr(SplitEncoder, "add", fail)
    with pytest.raises(Exception, match="the encoder failed"):
        transform(examples, tmp_path, reuse=True)
    assert made  # the analysis had kept its batches when the transform failed
    assert leftovers(tmp_path) == []
    out = tmp_path / "examples"
    assert not out.exists() or not os.listdir(out)
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]


def test_the_taxi_copies_take_under_half_the_decoded_bytes(examples, tmp_path):
    schema = parser.active_schema(schema_file.load_schema(examples))
    decoded_bytes = copy_bytes = rows = 0
    for number, path in enumerate(split_paths(examples, "train")):
        copy = str(tmp_path / f"{number}.arrow")
        decoded = list(record_batches(path, schema, copy))
        again = list(kept_batches(copy))
        assert len(again) == len(decoded) and all(a.equals(b) for a, b in zip(again, decoded))
        decoded_bytes += sum(batch.nbytes for batch in decoded)
        copy_bytes += os.path.getsize(copy)
        rows += sum(batch.num_rows for batch in again)
    assert copy_bytes < 0.5 * decoded_bytes
    assert rows > 10_000


def test_a_copy_appears_only_when_every_batch_was_read(examples, tmp_path, monkeypatch):
    from components.transform import inputs

    monkeypatch.setattr(inputs, "BATCH_ROWS", 64)  # many batches a file
    schema = parser.active_schema(schema_file.load_schema(examples))
    path = split_paths(examples, "train")[0]
    copy = str(tmp_path / "copy.arrow")

    stopped = record_batches(path, schema, copy)
    next(stopped)
    stopped.close()  # a reader that stops early, as an analysis that fails does
    assert leftovers(tmp_path) == []

    whole = list(record_batches(path, schema, copy))
    assert [n for n in os.listdir(tmp_path)] == ["copy.arrow"]
    again = list(kept_batches(copy))
    assert len(whole) > 10 and len(again) == len(whole)
    assert all(a.equals(b) for a, b in zip(again, whole))


def test_a_file_without_records_keeps_an_empty_copy(tmp_path):
    copy = str(tmp_path / "empty.arrow")
    with ArrowCopy(copy):
        pass
    assert os.path.getsize(copy) == 0 and list(kept_batches(copy)) == []
