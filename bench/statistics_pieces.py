"""StatisticsGen's Beam job on one large shard: cut into pieces of `piece_records` records
(the default) against the shard as one element (`--piece-records` above its records), each
a whole process of `python -m components.statistics_gen.engine` on the DirectRunner's worker
processes, alternating. Prints a JSON line per run and the medians.

    python -m bench.statistics_pieces RUN WORK [--shards 3] [--repeats 2]

RUN is a run folder that `python -m bench pipeline ... --keep-runs` kept. WORK gets an
Examples artifact of one train shard: the first `--shards` gzip shards of RUN's train split
joined end to end (gzip members concatenate), listed in a manifest as one shard with their
members, as our writer lists a shard it wrote whole.
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

from tfrecord_shards import fileio, shards

BEAM_ARGS = ["--runner=DirectRunner", "--direct_running_mode=multi_processing",
             "--direct_num_workers=2"]
WHOLE = 1 << 40  # more records than any shard: the shard is one element


def one_shard_artifact(run: str, work: str, count: int) -> tuple[str, int]:
    """(the artifact, its rows): RUN's first `count` train shards as one."""
    base = fileio.join(run, "pipelines", "tfrp-taxi", "ShardedExampleGen", "examples")
    examples = fileio.join(base, sorted(fileio.listdir(base))[0])
    manifest = shards.read_manifest(examples)
    listed = manifest["splits"]["train"]["shards"][:count]
    artifact = fileio.join(work, "one-shard")
    fileio.makedirs(fileio.join(artifact, "Split-train"))
    name = "Split-train/data_tfrecord-00000-of-00001.gz"
    members, rows, written = [], 0, 0
    with fileio.open_file(fileio.join(artifact, name), "wb") as out:
        for shard in listed:
            members += [[offset + written, records] for offset, records in shard["gzip_members"]]
            rows += shard["rows"]
            written += out.write(fileio.read_bytes(fileio.join(examples, shard["path"])))
    one = dict(listed[0], path=name, rows=rows, bytes=written, gzip_members=members)
    manifest["splits"] = {"train": dict(manifest["splits"]["train"], shards=[one])}
    fileio.write_text(fileio.join(artifact, "manifest.json"), json.dumps(manifest))
    fileio.write_bytes(fileio.join(artifact, "schema.pbtxt"),
                       fileio.read_bytes(fileio.join(examples, "schema.pbtxt")))
    return artifact, rows


def timed(artifact: str, out: str, piece_records: int) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "components.statistics_gen.engine", artifact, out,
                    "--splits", "train", "--piece-records", str(piece_records), *BEAM_ARGS],
                   check=True, capture_output=True)
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"seconds": round(seconds, 2), "cpu_s": round(
        after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 1)}


def main(argv=None) -> None:
    from components.statistics_gen.options import StatisticsGenOptions

    arguments = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    arguments.add_argument("run")
    arguments.add_argument("work")
    arguments.add_argument("--shards", type=int, default=3)
    arguments.add_argument("--repeats", type=int, default=2)
    given = arguments.parse_args(argv)
    artifact, rows = one_shard_artifact(given.run, given.work, given.shards)
    sides = {"pieces": StatisticsGenOptions().piece_records, "whole shard": WHOLE}
    found: dict[str, list[dict]] = {side: [] for side in sides}
    for _ in range(given.repeats):
        for side, piece_records in sides.items():
            result = timed(artifact, fileio.join(given.work, "out"), piece_records)
            found[side].append(result)
            print(json.dumps({"side": side, "rows": rows, **result}), flush=True)
    print(json.dumps({side: {"median_s": statistics.median(r["seconds"] for r in results),
                             "median_cpu_s": statistics.median(r["cpu_s"] for r in results)}
                      for side, results in found.items()}))


if __name__ == "__main__":
    main()
