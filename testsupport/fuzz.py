"""A fuzzer for ExampleGen: real inputs, mutated, each run through the Beam job.

Every case must end in one of two ways:
  - a clear error: one line that names the damaged file (and the row or offset), with no
    output that looks complete left behind;
  - a run whose counts balance: rows in = written + quarantined + lost to damage, the shards
    hold exactly the rows the manifest says, and the quarantine holds the quarantined rows.
Anything else is a failure: a traceback of ours, an error that names no file, a silent loss,
or a hang (a case that outlives its time limit).

The inputs are the first rows of the bundled taxi sample as CSV (plain and gzip), JSON Lines,
Parquet and TFRecord (gzip and plain, written by ExampleGen itself). Cases are drawn from a
seeded generator, so `--seed S --cases N` is the same N cases on any machine.
"""
from __future__ import annotations

import dataclasses
import gzip
import json
import multiprocessing
import os
import random
import shutil
import signal
import tempfile
import traceback
from typing import Callable, Iterator, Optional

BASE_ROWS = 300
TFRECORD_ROWS = 1500
CASE_SECONDS = 60
# "tfrecord.gz+manifest" is our own output folder as the source: its manifest indexes the
# shard's gzip members, so the loss from damage is known exactly and checked.
FORMATS = ("csv", "csv.gz", "jsonl", "parquet", "tfrecord.gz", "tfrecord",
           "tfrecord.gz+manifest")
TEXT_MUTATIONS = ("flip_bytes", "truncate_line", "duplicate_field", "unbalance_quote",
                  "mixed_encoding", "type_flip", "empty_file", "huge_field", "nul_bytes")
BINARY_MUTATIONS = ("flip_bytes", "truncate_file", "empty_file", "nul_bytes")
PARQUET_MUTATIONS = BINARY_MUTATIONS + ("type_flip", "huge_field")


@dataclasses.dataclass
class Outcome:
    case: int
    fmt: str
    mutations: list[str]
    on_bad_record: str
    kind: str  # "error" (clear), "balanced", or "failure"
    detail: str = ""


# -- inputs ----------------------------------------------------------------------------------
def write_base_inputs(folder: str) -> dict[str, str]:
    """The undamaged inputs, one file per format, from the bundled taxi sample."""
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    from components.example_gen import beam_job
    from components.example_gen.options import ExampleGenOptions
    from components.example_gen.sources.locate import taxi_csv_path
    from tfrecord_shards.shards import ShardingOptions

    table = pacsv.read_csv(taxi_csv_path()).slice(0, BASE_ROWS)
    paths = {fmt: os.path.join(folder, f"base.{fmt}") for fmt in FORMATS}
    paths["tfrecord.gz+manifest"] = os.path.join(folder, "gen-gzip")
    pacsv.write_csv(table, paths["csv"])
    with open(paths["csv"], "rb") as f, gzip.open(paths["csv.gz"], "wb") as g:
        g.write(f.read())
    with open(paths["jsonl"], "w") as f:
        for row in table.to_pylist():
            f.write(json.dumps({k: v for k, v in row.items() if v is not None}) + "\n")
    pq.write_table(table, paths["parquet"])
    # TFRecord inputs hold more rows, and small shards have small chunks: a gzip shard then
    # has several members (one per 64 kB chunk), so damage to one of them can be survived.
    tfrecord_csv = os.path.join(folder, "tfrecord-source", "rows.csv")
    os.makedirs(os.path.dirname(tfrecord_csv))
    pacsv.write_csv(pacsv.read_csv(taxi_csv_path()).slice(0, TFRECORD_ROWS), tfrecord_csv)
    for fmt, compression in (("tfrecord.gz", "gzip"), ("tfrecord", "none")):
        out = os.path.join(folder, f"gen-{compression}")
        beam_job.run(ExampleGenOptions(source=tfrecord_csv, splits="all:1", sharding=(
            ShardingOptions(shard_size_mb=1, compression=compression))), out)
        [shard] = [os.path.join(out, "Split-all", n) for n in os.listdir(
            os.path.join(out, "Split-all"))]
        shutil.copy(shard, paths[fmt])
    return paths


# -- mutations -------------------------------------------------------------------------------
def _lines(data: bytes) -> list[bytes]:
    return data.split(b"\n")


def _pick_line(rng: random.Random, lines: list[bytes]) -> int:
    return rng.randrange(1, max(2, len(lines) - 1)) if len(lines) > 2 else 0


def flip_bytes(data: bytes, rng: random.Random, fmt: str) -> bytes:
    damaged = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        if damaged:
            damaged[rng.randrange(len(damaged))] ^= rng.randint(1, 255)
    return bytes(damaged)


def truncate_line(data: bytes, rng: random.Random, fmt: str) -> bytes:
    lines = _lines(data)
    i = _pick_line(rng, lines)
    lines[i] = lines[i][:rng.randrange(len(lines[i]) + 1)]
    return b"\n".join(lines)


def truncate_file(data: bytes, rng: random.Random, fmt: str) -> bytes:
    return data[:rng.randrange(len(data))] if data else data


def duplicate_field(data: bytes, rng: random.Random, fmt: str) -> bytes:
    lines = _lines(data)
    i = _pick_line(rng, lines)
    if fmt == "jsonl":
        lines[i] = lines[i].replace(b'{"', b'{"fare": 1.5, "', 1)
    else:
        fields = lines[i].split(b",")
        j = rng.randrange(len(fields))
        lines[i] = b",".join(fields[:j + 1] + fields[j:])
    return b"\n".join(lines)


def unbalance_quote(data: bytes, rng: random.Random, fmt: str) -> bytes:
    lines = _lines(data)
    i = _pick_line(rng, lines)
    at = rng.randrange(len(lines[i]) + 1)
    lines[i] = lines[i][:at] + b'"' + lines[i][at:]
    return b"\n".join(lines)


def mixed_encoding(data: bytes, rng: random.Random, fmt: str) -> bytes:
    lines = _lines(data)
    i = _pick_line(rng, lines)
    foreign = rng.choice(["Café Ñandú".encode("latin-1"), "Café".encode("utf-16"),
                          "Крыло".encode("cp1251"), b"\xff\xfe\xfa"])
    at = rng.randrange(len(lines[i]) + 1)
    lines[i] = lines[i][:at] + foreign + lines[i][at:]
    return b"\n".join(lines)


def type_flip(data: bytes, rng: random.Random, fmt: str) -> bytes:
    lines = _lines(data)
    i = _pick_line(rng, lines)
    if fmt == "jsonl":
        replacement = rng.choice([b'"fare": "lots"', b'"fare": [1, 2]', b'"fare": {"a": 1}',
                                  b'"fare": true'])
        import re

        lines[i] = re.sub(rb'"fare": [^,}]*', replacement, lines[i], count=1)
    else:
        fields = lines[i].split(b",")
        fields[rng.randrange(len(fields))] = rng.choice([b"lots", b"1e999", b"-", b"[1]"])
        lines[i] = b",".join(fields)
    return b"\n".join(lines)


def empty_file(data: bytes, rng: random.Random, fmt: str) -> bytes:
    return b""


def huge_field(data: bytes, rng: random.Random, fmt: str) -> bytes:
    lines = _lines(data)
    i = _pick_line(rng, lines)
    huge = b"x" * rng.choice([1 << 20, 3 << 20])
    if fmt == "jsonl":
        lines[i] = lines[i].replace(b'{"', b'{"company": "' + huge + b'", "', 1)
    else:
        fields = lines[i].split(b",")
        fields[rng.randrange(len(fields))] = huge
        lines[i] = b",".join(fields)
    return b"\n".join(lines)


def nul_bytes(data: bytes, rng: random.Random, fmt: str) -> bytes:
    at = rng.randrange(len(data) + 1)
    return data[:at] + b"\x00" * rng.randint(1, 16) + data[at:]


TEXT_FNS: dict[str, Callable] = {f.__name__: f for f in (
    flip_bytes, truncate_line, duplicate_field, unbalance_quote, mixed_encoding, type_flip,
    empty_file, huge_field, nul_bytes, truncate_file)}


def parquet_variant(mutation: str, folder: str, rng: random.Random) -> Optional[str]:
    """Parquet's type flip and huge field are a second, well-formed file that disagrees with
    the first (a column's type) or holds a huge value."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = os.path.join(folder, "second.parquet")
    if mutation == "type_flip":
        pq.write_table(pa.table({"fare": ["lots", "of"], "trip_miles": [1, 2]}), path)
    elif mutation == "huge_field":
        pq.write_table(pa.table({"company": ["x" * (3 << 20)], "fare": [1.0]}), path)
    else:
        return None
    return path


def make_case(case: int, seed: int, base: dict[str, str], folder: str) -> tuple:
    """Writes case `case`'s input into `folder`; returns (format, mutations, on_bad_record)."""
    rng = random.Random(f"{seed}:{case}")
    fmt = rng.choice(FORMATS)
    if fmt == "parquet":
        pool = PARQUET_MUTATIONS
    elif fmt.startswith("tfrecord") or fmt == "csv.gz":
        pool = BINARY_MUTATIONS
    else:
        pool = TEXT_MUTATIONS
    mutations = rng.sample(pool, rng.choice([1, 1, 2, 3]))
    if fmt == "tfrecord.gz+manifest":
        # Size-keeping damage most of the time, so the index stays valid and is used.
        mutations = ["flip_bytes"] if rng.random() < 0.7 else mutations
        shutil.copytree(base[fmt], folder, dirs_exist_ok=True)
        [shard] = _shards(folder)
        with open(shard, "rb") as f:
            data = f.read()
        for mutation in mutations:
            data = TEXT_FNS[mutation](data, rng, fmt)
        with open(shard, "wb") as f:
            f.write(data)
        return fmt, mutations, rng.choice(["fail", "quarantine"])
    with open(base[fmt], "rb") as f:
        data = f.read()
    if fmt == "csv.gz":
        # Half the cases damage the text inside the gzip, half the gzip itself.
        text_first = rng.random() < 0.5
        if text_first:
            raw = gzip.decompress(data)
            for mutation in mutations:
                raw = TEXT_FNS[mutation](raw, rng, "csv")
            data = gzip.compress(raw)
            mutations = [f"text:{m}" for m in mutations]
        else:
            for mutation in mutations:
                data = TEXT_FNS[mutation](data, rng, fmt)
    else:
        for mutation in mutations:
            if fmt == "parquet" and parquet_variant(mutation, folder, rng):
                continue
            data = TEXT_FNS[mutation](data, rng, fmt)
    with open(os.path.join(folder, f"case-{case:05d}.{fmt}"), "wb") as f:
        f.write(data)
    return fmt, mutations, rng.choice(["fail", "quarantine"])


def _shards(folder: str) -> list[str]:
    return [os.path.join(root, name) for root, _, names in os.walk(folder) for name in names
            if name.startswith("data_tfrecord-")]


# -- one case --------------------------------------------------------------------------------
def _looks_complete(out: str) -> bool:
    from tfrecord_shards import shards

    return os.path.exists(os.path.join(out, shards.MANIFEST_FILE))


def check_balance(out: str, true_rows: Optional[int] = None) -> Optional[str]:
    """None when the output's counts balance, checked against the files themselves. With
    `true_rows` (an input whose row count the damage cannot change), a run that says it knows
    its losses must also account for every one of those rows."""
    from tfrecord_shards import shards, tfrecord_io

    manifest = shards.read_manifest(out)
    if manifest is None:
        return "the run succeeded but wrote no manifest"
    rows_in, written = manifest["rows_in"], manifest["rows_written"]
    quarantined, lost = manifest["rows_quarantined"], manifest.get("rows_lost", 0)
    if rows_in != written + quarantined + lost:
        return f"unbalanced: {rows_in} in, {written} written, {quarantined} quarantined, " \
               f"{lost} lost"
    if true_rows is not None and manifest["lost_count_known"] and rows_in != true_rows:
        return f"silent loss: the input holds {true_rows} rows, the run accounted for {rows_in}"
    in_shards = sum(tfrecord_io.count_records(os.path.join(out, s["path"]))
                    for split in manifest["splits"].values() for s in split["shards"])
    if in_shards != written:
        return f"the manifest says {written} rows written, the shards hold {in_shards}"
    quarantine = os.path.join(out, shards.QUARANTINE_DIR)
    rows = 0
    for name in os.listdir(quarantine) if os.path.isdir(quarantine) else []:
        with open(os.path.join(quarantine, name)) as f:
            rows += sum(1 for line in f if not json.loads(line).get("lost_bytes"))
    if rows != quarantined:
        return f"the manifest says {quarantined} rows quarantined, the quarantine holds {rows}"
    return None


def _on_alarm(signum, frame):
    raise TimeoutError(f"the case ran for more than {CASE_SECONDS} s")


def run_case(case: int, seed: int, base: dict[str, str], work: str) -> Outcome:
    """Builds case `case` and runs ExampleGen on it in this process."""
    from components.example_gen import beam_job
    from components.example_gen.options import ExampleGenOptions
    from components.example_gen.sources.base import input_error_line

    folder = os.path.join(work, f"case-{case:05d}")
    source = os.path.join(folder, "input")
    os.makedirs(source)
    fmt, mutations, on_bad_record = make_case(case, seed, base, source)
    out = os.path.join(folder, "out")
    outcome = Outcome(case, fmt, mutations, on_bad_record, "failure")
    file_format = {"csv.gz": "csv", "tfrecord.gz": "tfrecord",
                   "tfrecord.gz+manifest": "tfrecord"}.get(fmt, fmt)
    # Flipped bytes keep a TFRecord file's size: every record is either read or lost.
    true_rows = TFRECORD_ROWS if fmt.startswith("tfrecord") and mutations == ["flip_bytes"] \
        else None
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.alarm(CASE_SECONDS)
    try:
        beam_job.run(ExampleGenOptions(source=source, format=file_format,
                                       on_bad_record=on_bad_record), out)
        signal.alarm(0)
        problem = check_balance(out, true_rows)
        outcome.kind, outcome.detail = ("failure", problem) if problem else ("balanced", "")
    except Exception as error:  # classified below: every error is judged, none is hidden
        signal.alarm(0)
        line = input_error_line(error)
        names_file = line is not None and "\n" not in line and (
            "case-" in line or source in line)
        if isinstance(error, TimeoutError):
            outcome.detail = f"hang: {error}"
        elif _looks_complete(out):
            outcome.detail = f"failed but left a complete-looking output: {line or error!r}"
        elif names_file:
            outcome.kind, outcome.detail = "error", line
        else:
            outcome.detail = "".join(traceback.format_exception(error))[-3000:]
    finally:
        signal.alarm(0)
        shutil.rmtree(folder, ignore_errors=True)
    return outcome


_WORKER: dict = {}


def _init_worker(seed: int, base: dict[str, str], work: str) -> None:
    import logging
    import warnings

    # Each case's ending is judged and reported; Beam's own error logs would repeat it.
    warnings.filterwarnings("ignore")
    logging.disable(logging.CRITICAL)
    _WORKER.update(seed=seed, base=base, work=work)


def _worker_case(case: int) -> Outcome:
    return run_case(case, _WORKER["seed"], _WORKER["base"], _WORKER["work"])


def fuzz(cases: int, seed: int, jobs: int = 2,
         progress: Optional[Callable[[Outcome], None]] = None) -> list[Outcome]:
    """Runs cases 0..cases-1 of `seed` in `jobs` worker processes; returns their outcomes.
    A worker stuck past twice the case limit (in C code the alarm cannot interrupt) counts
    as a hang and is replaced."""
    work = tempfile.mkdtemp(prefix="tfrp-fuzz-")
    try:
        base = write_base_inputs(work)
        outcomes: list[Outcome] = []
        pending = list(range(cases))
        context = multiprocessing.get_context("spawn")
        while pending:
            with context.Pool(jobs, _init_worker, (seed, base, work)) as pool:
                results = [(case, pool.apply_async(_worker_case, (case,))) for case in pending]
                pending = []
                for position, (case, result) in enumerate(results):
                    try:
                        outcome = result.get(timeout=2 * CASE_SECONDS + 30)
                    except multiprocessing.TimeoutError:
                        outcome = Outcome(case, "?", [], "?", "failure", "hang: worker stuck")
                        pending = [c for c, r in results[position + 1:] if not r.ready()]
                        outcomes += [r.get() for c, r in results[position + 1:] if r.ready()]
                        pool.terminate()
                        outcomes.append(outcome)
                        break
                    outcomes.append(outcome)
                    if progress:
                        progress(outcome)
        return sorted(outcomes, key=lambda o: o.case)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def summarize(outcomes: list[Outcome]) -> dict:
    """The figure: cases tried, clear errors, balanced runs and failures, overall and per
    input format."""
    def counts(subset: list[Outcome]) -> dict:
        kinds = [o.kind for o in subset]
        return {"cases": len(subset), "clear_errors": kinds.count("error"),
                "balanced_runs": kinds.count("balanced"), "failures": kinds.count("failure")}

    return {**counts(outcomes), "by_format": {
        fmt: counts([o for o in outcomes if o.fmt == fmt]) for fmt in FORMATS}}


def iter_failures(outcomes: list[Outcome]) -> Iterator[Outcome]:
    return (o for o in outcomes if o.kind == "failure")
