"""What the process entry points change about imports, each in a fresh interpreter:
google-api-core's version check without its scan of every installed package
(`pipeline/google_version_check.py`: the pinned release scans, the entry point's process does
not, and the check still runs), and `tfx.components` without its `__init__` until a name
other than a component class is asked for (`pipeline/tfx_components.py`)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Counts `importlib.metadata.packages_distributions()` calls in the process, then runs the
# command given (a module with its arguments, as `python -m` would) or imports BigQuery's
# client, and prints the count last.
COUNTED = """
import importlib.metadata, runpy, sys, warnings
scans = []
real = importlib.metadata.packages_distributions
importlib.metadata.packages_distributions = lambda: scans.append(1) or real()
mode, *args = sys.argv[1:]
if mode == "entry-point":
    from pipeline import process_exit
    end = process_exit._end
    process_exit._end = lambda: (print("scans", len(scans)), end())
    sys.argv = args
    runpy.run_module(args[0], run_name="__main__", alter_sys=True)
if mode == "skipped":
    from pipeline import google_version_check
    google_version_check.skip_package_scan()
import google.api_core
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    status = google.api_core.check_python_version("google.cloud.bigquery")
import google.cloud.bigquery
import json
print(status.name, json.dumps([str(w.message) for w in caught]))
print("scans", len(scans))
"""


def fresh_python(script: str, *args: str) -> subprocess.CompletedProcess:
    """`script` with `args` in a new interpreter, here, which must succeed."""
    result = subprocess.run([sys.executable, "-W", "ignore", "-c", script, *args],
                            capture_output=True, text=True, cwd=ROOT,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def counted(*args: str) -> tuple[int, str]:
    result = fresh_python(COUNTED, *args)
    *_, last = result.stdout.splitlines()
    assert last.startswith("scans "), result.stdout
    return int(last.split()[1]), result.stdout


def test_the_pinned_version_check_scans_every_package_unless_skipped():
    scanned, _ = counted("as-installed")
    assert scanned >= 2  # google.api_core's own check, then BigQuery's
    skipped, output = counted("skipped")
    assert skipped == 0
    # The check itself still runs: it warns unless this Python is supported, naming the module.
    status, messages = output.splitlines()[0].split(" ", 1)
    warned = json.loads(messages)
    assert status.startswith("PYTHON_VERSION_"), output
    assert (status == "PYTHON_VERSION_SUPPORTED") == (not warned), output
    assert all("google.cloud.bigquery" in m for m in warned), warned


def test_tfrp_imports_beam_without_scanning_a_package(tmp_path):
    data = tmp_path / "rows.csv"
    data.write_text("a,b\n1,x\n2,y\n", encoding="utf-8")
    scanned, output = counted("entry-point", "pipeline.cli", "examplegen", str(data),
                              str(tmp_path / "examples"))
    assert "rows" in output and scanned == 0, output


DEFERRED = """
import sys
from pipeline import tfx_components
tfx_components.defer_package_init()
import tfx.components
from tfx.components.example_gen.component import FileBasedExampleGen
assert tfx.components.FileBasedExampleGen is FileBasedExampleGen
print("class only:", "keras_tuner" in sys.modules, "tfx.components.tuner.component" in sys.modules)
names = tfx.components.__all__
print("after __all__:", "Tuner" in names, tfx.components.Tuner.__module__)
"""


def test_a_component_class_imports_only_its_module_and_other_names_the_whole_package():
    result = fresh_python(DEFERRED)
    assert result.stdout.splitlines() == [
        "class only: False False",
        "after __all__: True tfx.components.tuner.component"], result.stdout
