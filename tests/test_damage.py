"""One flipped byte in a shard, gzip (our default) and plain, at its start, middle and end:
the error names the file, and reading past the damage loses only the damaged gzip member
(or record), counted exactly from the manifest's member index."""
from __future__ import annotations

import glob
import logging
import os
import re
import shutil

import pytest

from tfrecord_shards import shards, tfrecord_io
from tfrecord_shards.codec import schema_file
from components.example_gen import beam_job
from components.example_gen.options import ExampleGenOptions
from tfrecord_shards.shards import ShardingOptions
from components.trainer.input import build_dataset
from components.trainer.options import InputConfig
from conftest import tfrp

WHERE = {"start": lambda size: 40, "middle": lambda size: size // 2,
         "end": lambda size: size - 12}


@pytest.fixture(scope="module", params=["gzip", "none"])
def examples(request, taxi_slice_dir, tmp_path_factory):
    """The taxi slice in one shard per split; gzip shards hold several members (64 kB of
    records each, from the small target size)."""
    out = tmp_path_factory.mktemp(f"damage-{request.param}") / "examples"
    beam_job.run(ExampleGenOptions(source=os.path.join(taxi_slice_dir, "data.csv"),
                                   sharding=ShardingOptions(shard_size_mb=4,
                                                            compression=request.param)),
                 str(out))
    return out, request.param


def damaged_copy(examples, tmp_path, where: str):
    """A copy of the artifact whose train shard has one byte flipped; (copy, shard, offset)."""
    folder, _ = examples
    copy = tmp_path / "examples"
    shutil.copytree(folder, copy)
    (shard,) = glob.glob(str(copy / "Split-train" / "*"))
    data = bytearray(open(shard, "rb").read())
    offset = WHERE[where](len(data))
    data[offset] ^= 0x55
    with open(shard, "wb") as f:
        f.write(bytes(data))
    return copy, shard, offset


def intact(examples) -> list[bytes]:
    folder, _ = examples
    (shard,) = glob.glob(str(folder / "Split-train" / "*"))
    return [r for _, r in tfrecord_io.iter_records(shard)]


def expected_survivors(examples, offset: int) -> tuple[list[bytes], int]:
    """The records outside the member that holds `offset`, and how many that member held."""
    records = intact(examples)
    folder, _ = examples
    (shard,) = glob.glob(str(folder / "Split-train" / "*"))
    index = tfrecord_io.gzip_member_index(shard)
    assert index and len(index) >= 3, "the gzip shard should hold several members"
    member = max(i for i, (start, _) in enumerate(index) if start <= offset)
    first = sum(count for _, count in index[:member])
    lost = index[member][1]
    return records[:first] + records[first + lost:], lost


@pytest.mark.parametrize("where", sorted(WHERE))
def test_damage_is_named_and_only_the_damaged_part_is_lost(examples, tmp_path, where):
    copy, shard, offset = damaged_copy(examples, tmp_path, where)
    with pytest.raises(tfrecord_io.CorruptRecordError, match=os.path.basename(shard)):
        list(tfrecord_io.iter_records(shard))
    items = [item for _, item in tfrecord_io.iter_records(shard, resync=True)]
    survivors = [item for item in items if isinstance(item, bytes)]
    regions = [item for item in items if isinstance(item, tfrecord_io.CorruptRegion)]
    assert len(regions) == 1
    if examples[1] == "gzip":
        expected, lost = expected_survivors(examples, offset)
        assert survivors == expected
        assert regions[0].records_lost == lost > 0
    else:  # plain: the resynchronising reader loses just the damaged record
        records = intact(examples)
        assert len(survivors) == len(records) - 1
        assert all(record in records for record in survivors)


@pytest.mark.parametrize("where", sorted(WHERE))
def test_skip_corrupt_training_input_reads_everything_else_and_logs_the_loss(
        examples, tmp_path, where, caplog):
    copy, shard, offset = damaged_copy(examples, tmp_path, where)
    schema = schema_file.load_schema(str(copy))
    total = shards.read_manifest(str(copy))["splits"]["train"]["rows"]
    with caplog.at_level(logging.WARNING):
        dataset = build_dataset(shard, schema, None, feature_keys=["fare"],
                                config=InputConfig(batch_size=100, training=False,
                                                   num_epochs=1, skip_corrupt=True))
        rows = sum(int(batch["fare"].shape[0]) for batch in dataset)
    assert os.path.basename(shard) in caplog.text
    if examples[1] == "gzip":
        _, lost = expected_survivors(examples, offset)
        assert rows == total - lost
        assert f"{lost} records lost" in caplog.text
    else:
        assert rows == total - 1


def test_inspect_names_a_damaged_gzip_shard_in_one_line(examples, tmp_path):
    if examples[1] != "gzip":
        pytest.skip("the plain-file case is tests/test_cli.py's corrupt-record test")
    copy, shard, _ = damaged_copy(examples, tmp_path, "middle")
    result = tfrp("inspect", shard, "--limit", "100000", check=False)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    # Whichever check sees the damage first (a record's CRC, or the member's gzip CRC) names it.
    assert re.fullmatch(rf"Error: \S*{re.escape(os.path.basename(shard))}: corrupt TFRecord at "
                        rf"byte offset \d+: (data CRC mismatch|length CRC mismatch|"
                        rf"gzip data damaged .*)\n", result.stderr), result.stderr


def test_example_gen_over_a_damaged_gzip_source_balances_with_the_true_loss(examples,
                                                                            tmp_path):
    """Re-sharding a damaged gzip shard of ours in quarantine mode: the records of the
    damaged member are counted as lost (from the index), everything else is written."""
    if examples[1] != "gzip":
        pytest.skip("a plain file has no member index; its loss is a region of bytes")
    copy, shard, offset = damaged_copy(examples, tmp_path, "middle")
    expected, lost = expected_survivors(examples, offset)
    manifest = beam_job.run(ExampleGenOptions(source=str(copy / "Split-train"),
                                              splits="all:1", on_bad_record="quarantine"),
                            str(tmp_path / "out"))
    assert manifest["rows_lost"] == lost > 0 and manifest["lost_count_known"]
    assert manifest["rows_written"] == len(expected)
    assert manifest["rows_in"] == manifest["rows_written"] + manifest["rows_quarantined"] + \
        manifest["rows_lost"]
    assert manifest["rows_quarantined"] == 0
    quarantine = glob.glob(str(tmp_path / "out" / "quarantine" / "*"))
    assert quarantine and f"{lost} records lost" in open(quarantine[0]).read()


def test_partition_folders_of_null_empty_and_their_literal_names_differ():
    folders = {value: shards.partition_dir("c", value)
               for value in (None, "", "__null__", "__empty__", b"__null__")}
    assert folders[None] == "c=__null__" and folders[""] == "c=__empty__"
    assert len({folders[v] for v in (None, "", "__null__", "__empty__")}) == 4
    assert folders["__null__"] == folders[b"__null__"]


def test_hidden_files_are_left_out_and_named_in_the_manifest(taxi_csv, tmp_path):
    source = tmp_path / "source"
    source.mkdir()
    with open(taxi_csv) as f:
        head = "".join(next(f) for _ in range(101))
    (source / "part-0.csv").write_text(head)
    (source / "_SUCCESS").write_text("")
    (source / ".part-0.csv.crc").write_text("crc")
    manifest = beam_job.run(ExampleGenOptions(source=str(source)), str(tmp_path / "out"))
    assert manifest["rows_written"] == 100
    assert sorted(os.path.basename(p) for p in manifest["hidden_files_skipped"]) == [
        ".part-0.csv.crc", "_SUCCESS"]


def test_our_output_folder_reads_back_as_a_source_without_its_layout_files(examples,
                                                                          tmp_path):
    """manifest.json, schema.pbtxt, quarantine/ and a plain output's record indexes (index/)
    describe the shards; read as TFRecords they would be damaged records, so they are named
    in the manifest instead."""
    out, compression = examples
    manifest = beam_job.run(ExampleGenOptions(source=str(out)), str(tmp_path / "again"))
    assert manifest["format"] == "tfrecord"
    assert manifest["rows_in"] == manifest["rows_written"] == \
        shards.read_manifest(str(out))["rows_written"]
    assert manifest["rows_lost"] == manifest["bytes_lost"] == 0
    indexes = sorted(os.path.relpath(os.path.join(root, name), out)
                     for root, _, names in os.walk(os.path.join(out, "index")) for name in names)
    assert bool(indexes) == (compression == "none")
    assert sorted(os.path.relpath(p, out) for p in manifest["layout_files_skipped"]) == \
        sorted(indexes + ["manifest.json", "schema.pbtxt"])
