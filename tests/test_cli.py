"""The `tfrp` commands, run as a user would, on real files."""
from __future__ import annotations

import json
import re
import os
import subprocess
import sys

import pytest

from tfrecord_shards import tfrecord_io
from conftest import bench, tfrp


@pytest.fixture(scope="module")
def cli_out(taxi_slice_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "out"
    result = tfrp("examplegen", os.path.join(taxi_slice_dir, "data.csv"), str(out),
                  "--num-shards", "2", "--compression", "none")
    return out, result.stdout


def test_examplegen_cli_writes_shards(cli_out):
    out, stdout = cli_out
    assert "train:" in stdout and "eval:" in stdout
    assert sorted(os.listdir(out / "Split-train")) == [
        "data_tfrecord-00000-of-00002", "data_tfrecord-00001-of-00002"]


def test_examplegen_and_inspect_import_neither_tensorflow_nor_tfx(taxi_slice_dir, tmp_path):
    """The two commands a data engineer runs most start without TensorFlow, TFX or TFMA
    (seconds of imports each); a gzip run at the stock level reads back the same rows."""
    out = str(tmp_path / "out")
    script = (
        "import sys\n"
        "from pipeline.cli import tfrp\n"
        f"tfrp.main(['examplegen', {os.path.join(taxi_slice_dir, 'data.csv')!r}, {out!r}, "
        "'--compression-level', '6'], standalone_mode=False)\n"
        f"tfrp.main(['inspect', {out!r}, '--limit', '2000', '--format', 'json'], "
        "standalone_mode=False)\n"
        "heavy = [m for m in ('tensorflow', 'tfx', 'tensorflow_model_analysis', "
        "'tensorflow_transform', 'keras') if m in sys.modules]\n"
        "print('heavy modules:', heavy)\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            check=True)
    assert "heavy modules: []" in result.stdout
    rows = [line for line in result.stdout.splitlines() if line.startswith("{")]
    manifest = json.load(open(os.path.join(out, "manifest.json")))
    assert len(rows) == manifest["rows_written"] == 2000
    shards = [shard["path"] for split in manifest["splits"].values() for shard in split["shards"]]
    assert shards and all(path.endswith(".gz") for path in shards)
    for path in shards:  # gzip's XFL byte: 4 at level 1 (our default), 0 at levels 2-8
        with open(os.path.join(out, path), "rb") as f:
            assert f.read(10)[8] == 0


def test_inspect_table_and_json_use_stored_schema(cli_out):
    out, _ = cli_out
    table = tfrp("inspect", str(out / "Split-train"), "--limit", "3").stdout
    lines = table.strip().splitlines()
    assert "fare" in lines[0] and "company" in lines[0]
    assert len(lines) == 2 + 3
    rows = [json.loads(l) for l in tfrp("inspect", str(out), "--limit", "5", "--format",
                                         "json").stdout.splitlines()]
    assert len(rows) == 5
    assert all(isinstance(r["fare"], float) and isinstance(r["trip_start_hour"], int)
               for r in rows)


def test_inspect_reports_corrupt_record_with_file_and_offset(cli_out, tmp_path):
    out, _ = cli_out
    shard = out / "Split-eval" / "data_tfrecord-00000-of-00002"
    data = bytearray(shard.read_bytes())
    offsets = [o for o, _ in tfrecord_io.iter_records(str(shard))]
    data[offsets[2] + 20] ^= 0xFF  # inside the third record's payload
    broken = tmp_path / "broken.tfrecord"
    broken.write_bytes(bytes(data))
    result = tfrp("inspect", str(broken), "--limit", "100", check=False)
    assert result.returncode != 0
    assert f"{broken}: corrupt TFRecord at byte offset {offsets[2]}" in result.stderr


def test_inspect_reads_stock_csv_example_gen_output(stock_taxi_examples):
    examples, _ = stock_taxi_examples
    rows = [json.loads(l) for l in tfrp("inspect", os.path.join(examples, "Split-train"),
                                         "--limit", "4", "--format", "json").stdout.splitlines()]
    assert len(rows) == 4 and all("fare" in r for r in rows)


def test_examplegen_cli_bad_row_is_one_line_error(tmp_path):
    (tmp_path / "bad.csv").write_text("a,b\n1,2\n3\n")
    result = tfrp("examplegen", str(tmp_path / "bad.csv"), str(tmp_path / "out"), check=False)
    assert result.returncode != 0
    message = result.stderr.strip().splitlines()[-1]
    assert message.startswith("Error: ") and "bad.csv: row 3: expected 2 fields, got 1" in message
    assert not os.path.exists(tmp_path / "out" / "manifest.json")


def test_help_lists_all_commands():
    out = tfrp("--help").stdout
    for command in ("run", "report", "compile", "submit", "examplegen", "inspect", "index",
                    "data-service", "spark-cluster"):
        assert f"  {command}" in out
    # Benchmarks and the fuzzer are the checkout's (`python -m bench`), not the product's.
    assert "  bench" not in out and "  fuzz" not in out
    assert "  fuzz " in bench("--help").stdout


@pytest.mark.slow
def test_examplegen_shows_progress_bars_on_a_terminal_only(taxi_slice_dir, tmp_path):
    """Under a pseudo-terminal (util-linux `script`) tqdm draws the profile and encode bars to
    the end; piped output, as in CI logs, has none."""
    import shlex

    source = os.path.join(taxi_slice_dir, "data.csv")
    command = " ".join(shlex.quote(a) for a in [sys.executable, "-m", "pipeline.cli",
                                                "examplegen", source, str(tmp_path / "tty")])
    typescript = tmp_path / "typescript"
    subprocess.run(["script", "-qfec", f"stty cols 120 rows 40; {command}", str(typescript)],
                   capture_output=True, text=True, check=True, timeout=300)
    shown = typescript.read_text(errors="replace").replace("\r", "\n")
    assert re.search(r"profile: 100%.*1/1", shown), shown[-2000:]
    assert re.search(r"encode: 100%.*2\.00k/2\.00k", shown), shown[-2000:]
    piped = tfrp("examplegen", source, str(tmp_path / "piped"))
    assert "encode:" not in piped.stdout + piped.stderr


@pytest.mark.slow
def test_bench_plot_draws_one_labelled_bar_per_path(tmp_path):
    """`--plot` on a real (small) benchmark: a PNG with a bar per measured path."""
    import matplotlib.image as mpimg
    import numpy as np

    chart = tmp_path / "encoder.png"
    result = bench("encoder", "--rows", "2000", "--repeats", "1", "--json",
                  "--plot", str(chart))
    assert f"Chart: {chart}" in result.stderr
    paths = json.loads(result.stdout)["paths"]
    pixels = mpimg.imread(str(chart))[..., :3]
    assert pixels.shape[0] > 200 and pixels.shape[1] > 300
    # The bars are the chart's one fill colour (#4878a8): one separate bar per path.
    bar = np.all(np.abs(pixels - np.array([0x48, 0x78, 0xa8]) / 255) < 0.02, axis=-1)
    columns = bar.any(axis=0)
    starts = np.flatnonzero(columns[1:] & ~columns[:-1])
    assert len(paths) >= 2 and len(starts) == len(paths), (starts, list(paths))


def test_every_sharding_setting_is_a_flag_of_both_commands_and_reaches_every_component(
        tmp_path):
    """A sharding setting is one field on ShardingOptions: both commands get its flag with
    its help and default, and PipelineConfig hands it to ExampleGen and Transform by name."""
    import dataclasses

    from tfrecord_shards.shards import ShardingOptions
    from pipeline.configs import PipelineConfig

    helps = {command: re.sub(r"\s+", " ", tfrp(command, "--help").stdout)
             for command in ("examplegen", "run")}
    samples = {"num_shards": 3, "shard_size_mb": 2.5, "compression": "none",
               "compression_level": 4, "gzip_member_kib": 256}
    fields = dataclasses.fields(ShardingOptions)
    assert {f.name for f in fields} == set(samples)
    for field in fields:
        flag = "--" + field.name.replace("_", "-")
        for command, text in helps.items():
            assert flag in text, (command, flag)
            assert field.metadata["help"].split(" (")[0] in text, (command, flag)
        config = PipelineConfig.create(None, {field.name: str(samples[field.name])})
        if field.name == "num_shards":
            continue  # checked with shard_size_mb unset below
        for options in (config.example_gen_options("x.csv").sharding,
                        config.transform_options().sharding):
            assert getattr(options, field.name) == samples[field.name]
    yaml_file = tmp_path / "settings.yaml"
    yaml_file.write_text("num_shards: 3\ncompression: none\n")
    config = PipelineConfig.create(str(yaml_file))
    assert config.example_gen_options("x.csv").sharding == \
        ShardingOptions(num_shards=3, compression="none")


def test_a_wrong_setting_is_named_by_its_flag_on_the_command_line_and_by_name_elsewhere(
        tmp_path):
    from tfrecord_shards.options import SettingError
    from pipeline.configs import PipelineConfig

    refused = tfrp("examplegen", "x.csv", str(tmp_path / "a"), "--compression-level", "12",
                   check=False)
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines()[-1] == \
        "Error: --compression-level must be 1 to 9, not 12"
    both = tfrp("examplegen", "x.csv", str(tmp_path / "b"), "--num-shards", "2",
                "--shard-size-mb", "1", check=False)
    assert both.stderr.strip().splitlines()[-1] == \
        "Error: give --num-shards or --shard-size-mb, not both"
    by_set = tfrp("run", "--set", "num_shards=0", check=False)
    assert by_set.stderr.strip().splitlines()[-1] == "Error: num_shards must be at least 1, not 0"
    yaml_file = tmp_path / "settings.yaml"
    yaml_file.write_text("compression: zip\n")
    with pytest.raises(SettingError, match="^compression must be gzip or none, not 'zip'$"):
        PipelineConfig.create(str(yaml_file))


@pytest.mark.parametrize("argv, status", [(["--help"], 0), (["inspect", "no-such-folder"], 2)])
def test_the_process_ends_with_the_commands_status_after_exit_handlers_and_threads(
        argv, status):
    """`tfrp` skips the interpreter's finalization and C++ static teardown (where Arrow's
    pools can abort a finished command), but not what Python's exit does before them: a
    running thread is joined, exit handlers the libraries registered run, buffered output is
    flushed, and the status is the command's."""
    script = (
        "import atexit, sys, threading, time\n"
        "from pipeline.cli import tfrp\n"
        "atexit.register(lambda: print('exit handler ran'))  # as a library does\n"
        "threading.Thread(target=lambda: (time.sleep(0.5), print('thread finished'))).start()\n"
        f"sys.argv = ['tfrp', *{argv!r}]\n"
        "tfrp.entry_point()\n"
        "print('not reached')\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == status, result.stderr
    assert result.stdout.splitlines()[-2:] == ["thread finished", "exit handler ran"]
    assert "not reached" not in result.stdout


def _bad_csv(folder, problem: str) -> str:
    """A CSV of 3,000 good rows (a label of three classes) with one bad row in it: a quote
    that is never closed near its end, or a row with one field too many."""
    path = os.path.join(folder, f"{problem}.csv")
    with open(path, "w", newline="", encoding="utf-8") as f:
        f.write("a,b,c,label\n")
        for i in range(3000):
            if problem == "too-many-fields" and i == 100:
                f.write("100,x,y,1,extra\n")
            f.write(f"{i},x,y,{i % 3}\n")
        if problem == "unterminated-quote":
            f.write('3000,"never closed,y,1\n')
            f.writelines(f"{3001 + i},x,y,2\n" for i in range(5))
    return path


BAD_ROWS = {"unterminated-quote": "row 3002: a quote opened in this row is never closed, so "
                                  "its cell runs on to the end of the file (expected 4 fields, "
                                  "got 2)",
            "too-many-fields": "row 102: expected 4 fields, got 5: 1 more than the header has "
                               "(a delimiter inside an unquoted value?)"}


@pytest.mark.slow
@pytest.mark.parametrize("problem", sorted(BAD_ROWS))
def test_a_bad_csv_row_is_one_line_naming_the_file_row_and_cause(problem, tmp_path):
    """Found inside the Beam job: no Beam log line or traceback, only ours (both with -v)."""
    source = _bad_csv(str(tmp_path), problem)
    result = tfrp("examplegen", source, str(tmp_path / "out"), check=False, as_user=True)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [f"Error: {source}: {BAD_ROWS[problem]}"]
    verbose = tfrp("-v", "examplegen", source, str(tmp_path / "out-v"), check=False)
    assert "Traceback" in verbose.stderr and "apache_beam" in verbose.stderr


@pytest.mark.slow
@pytest.mark.parametrize("problem", sorted(BAD_ROWS))
def test_a_bad_csv_row_stops_tfrp_run_in_one_line(problem, tmp_path):
    source = _bad_csv(str(tmp_path), problem)
    result = tfrp("run", "--dataset", "table", "--data-root", source, "--set", "label_key=label",
                  "--output-root", str(tmp_path / "runs"), check=False, as_user=True)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [f"Error: the run failed: {source}: {BAD_ROWS[problem]}"]
    assert re.search(r"^  ShardedExampleGen +failed", result.stdout, re.M)


def test_a_process_that_imports_tfrp_without_running_it_exits_as_python_does():
    """The entry point's exit handler ends the process only for a body run through it:
    another program that imports the CLI and calls a command keeps its own exit status."""
    script = ("import sys\n"
              "from pipeline.cli.tfrp import main\n"
              "main(['inspect', 'no-such-folder'])\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 2, result.stderr


def test_tfrp_imports_only_the_stock_components_a_run_uses():
    """`tfrp` puts off `tfx.components`' __init__ (all 16 stock components, with KerasTuner,
    Kubernetes' client and TFMA), so a run imports only the components it builds; a name
    the package re-exports still loads it whole, the same classes as before."""
    script = ("import sys\n"
              "from pipeline.cli import tfrp\n"
              "from pipeline import local_runner\n"
              "unused = ['keras_tuner', 'kubernetes', 'tfx.components.bulk_inferrer',\n"
              "          'tfx.components.tuner', 'tfx.components.infra_validator']\n"
              "print(sorted(m for m in unused if m in sys.modules))\n"
              "from tfx.components import Tuner, Pusher\n"
              "from tfx.components.tuner.component import Tuner as TunerClass\n"
              "import tfx.components\n"
              "print(Tuner is TunerClass, len(tfx.components.__all__),\n"
              "      'keras_tuner' in sys.modules)\n")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run([sys.executable, "-W", "ignore", "-c", script],
                            capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == ["[]", "True 16 True"], result.stdout
