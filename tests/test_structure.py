"""The code's layout rules from docs/ARCHITECTURE.md, checked on the source itself: no import
cycle between our modules (lazy imports inside functions count too), and the rooms import
only what they may."""
from __future__ import annotations

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRODUCT = ("components", "pipeline", "tfrecord_shards", "shard_readers", "spark_shards",
           "local_cluster")
PACKAGES = PRODUCT + ("bench", "testsupport")


def _modules() -> dict[str, str]:
    """{dotted module name: file} for every module of our packages."""
    found = {}
    for package in PACKAGES:
        for folder, _, names in os.walk(os.path.join(ROOT, package)):
            for name in names:
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    dotted = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                    found[dotted.removesuffix(".__init__")] = path
    return found


def import_graph() -> dict[str, set[str]]:
    """{module: the modules of ours it imports anywhere in its file}."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                # `from package import module` imports the module; `from module import name`
                # imports the module.
                targets = [f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}"
                           in modules else node.module for alias in node.names]
            graph[name] |= {t for t in targets if t in modules and t != name}
    # Importing `a.b.c` runs `a/__init__` and `a/b/__init__` first: a package's `__init__`
    # that imports (even lazily) what imports one of its modules is a cycle too.
    for name in modules:
        parts = name.split(".")
        graph[name] |= {".".join(parts[:depth]) for depth in range(1, len(parts))
                        if ".".join(parts[:depth]) in modules} - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan's algorithm), except a
    package with only its own modules (an `__init__` re-exporting them)."""
    index, low, on_stack, stack, groups = {}, {}, set(), [], []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            within_package = any(all(m == p or m.startswith(p + ".") for m in group)
                                 for p in group)
            if len(group) > 1 and not within_package:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def test_no_module_of_ours_takes_part_in_an_import_cycle():
    graph = import_graph()
    assert len(graph) > 50
    assert cycles(graph) == []


def test_the_checker_finds_a_cycle_through_a_package_init():
    """`a/__init__` importing (lazily) `b`, which imports `a.mod`: importing `a.mod` runs
    `a/__init__` first, so this is a cycle. A package re-exporting its own module is not."""
    graph = {"a": {"b"}, "a.mod": {"a"}, "b": {"a.mod"},
             "c": {"c.mod"}, "c.mod": {"c"}}
    assert cycles(graph) == [["a", "a.mod", "b"]]


def test_the_checker_finds_a_cycle_through_a_lazy_import():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


def test_components_bench_and_testsupport_import_no_pipeline():
    """Only the benchmarks' command line (bench/cli.py, bench/__main__.py) takes the
    pipeline's: its process set-up and its one-line errors."""
    graph = import_graph()
    wrong = sorted((name, target) for name, targets in graph.items()
                   if name.startswith(("components", "bench", "testsupport"))
                   and name not in ("bench.cli", "bench.__main__")
                   for target in targets if target.split(".")[0] == "pipeline")
    assert wrong == []


def test_the_product_imports_neither_bench_nor_testsupport():
    """The wheel holds components/ and pipeline/ alone (setup.py): a product module importing
    the benchmarks or the tests' support would fail where it is installed."""
    graph = import_graph()
    wrong = sorted((name, target) for name, targets in graph.items()
                   if name.split(".")[0] in ("components", "pipeline")
                   for target in targets if target.split(".")[0] in ("bench", "testsupport"))
    assert wrong == []


# Modules that touch only this machine's own files, never an artifact, a source or a serving
# folder (which may be gs:// or s3:// URIs and go through tfrecord_shards/fileio.py).
LOCAL_ONLY = {
    "tfrecord_shards/fileio.py": "the file layer itself",
    "local_cluster/listening.py": "reads /proc/net/tcp*",
    "local_cluster/spark.py": "a local Spark cluster's work folders and logs",
    "spark_shards/session.py": "finds the local Java runtime",
    "pipeline/configs.py": "the repository's schemas folder and the YAML config file",
    "pipeline/datasets.py": "writes the bundled digits images to a local folder",
    "pipeline/kubeflow_runner.py": "the job file TFX's compiler writes in a temporary folder",
    "pipeline/progress.py": "ML Metadata's SQLite file, local by rule (local_runner)",
}
_OS_FILE_CALLS = {"listdir", "makedirs", "remove", "rename", "replace", "walk", "stat",
                  "scandir", "mkdir", "rmdir", "unlink"}


def local_file_calls(source: str) -> list[tuple[int, str]]:
    """(line, call) of each call in `source` that takes a path as a local file: any os.path
    function (`abspath` and `normpath` turn `gs://b` into `./gs:/b`), `open`, os's file
    functions, shutil, pathlib and glob.glob."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        call, name = node.func, None
        if isinstance(call, ast.Name) and call.id == "open":
            name = "open"
        elif isinstance(call, ast.Attribute):
            owner = call.value
            if isinstance(owner, ast.Attribute) and isinstance(owner.value, ast.Name) and \
                    owner.value.id == "os" and owner.attr == "path":
                name = f"os.path.{call.attr}"
            elif isinstance(owner, ast.Name) and owner.id == "os" and \
                    call.attr in _OS_FILE_CALLS:
                name = f"os.{call.attr}"
            elif isinstance(owner, ast.Name) and owner.id in ("shutil", "pathlib"):
                name = f"{owner.id}.{call.attr}"
            elif isinstance(owner, ast.Name) and owner.id == "glob" and call.attr == "glob":
                name = "glob.glob"
        if name:
            found.append((node.lineno, name))
    return sorted(found)


def test_paths_go_through_the_file_layer():
    """Artifact, source and serving paths may be URIs: outside the modules that only touch
    this machine's files, no os.path, open, shutil or glob is applied to a path."""
    offenders = []
    for package in ("components", "pipeline"):
        for folder, _, names in os.walk(os.path.join(ROOT, package)):
            for name in names:
                path = os.path.join(folder, name)
                relative = os.path.relpath(path, ROOT)
                if not name.endswith(".py") or relative in LOCAL_ONLY:
                    continue
                with open(path, encoding="utf-8") as f:
                    offenders += [f"{relative}:{line}: {call}"
                                  for line, call in local_file_calls(f.read())]
    assert not offenders, "\n".join(sorted(offenders))


def test_the_file_layer_checker_finds_local_calls():
    found = local_file_calls("import os\nx = os.path.abspath(p)\nwith open(p) as f: pass\n"
                             "os.path.join(a, b)\nfileio.join(a, b)\nos.environ.get('X')\n")
    assert [call for _, call in found] == ["os.path.abspath", "open", "os.path.join"]



def test_run_fn_reads_as_the_outline_of_a_training_run():
    """The Trainer's run_fn stays short enough to read whole (45 lines): the work is in the
    functions it calls."""
    tree = ast.parse(open(os.path.join(ROOT, "components", "trainer", "module.py")).read())
    (run_fn,) = [node for node in tree.body
                 if isinstance(node, ast.FunctionDef) and node.name == "run_fn"]
    assert run_fn.end_lineno - run_fn.lineno + 1 <= 45


def _product_files() -> list[str]:
    return sorted(path for name, path in _modules().items() if name.split(".")[0] in PRODUCT)


def _functions(path: str) -> list[tuple[str, int]]:
    """(name, lines) of every function in `path`, methods and nested ones too."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    return [(node.name, node.end_lineno - node.lineno + 1) for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]


def test_no_product_module_is_over_600_lines():
    """A module longer than that holds more than one concept: split it along them."""
    long = []
    for path in _product_files():
        with open(path, encoding="utf-8") as f:
            lines = f.read().count("\n")
        if lines > 600:
            long.append(f"{os.path.relpath(path, ROOT)}: {lines}")
    assert long == []


def test_the_trainers_functions_read_whole():
    """No function of the Trainer's over 80 lines, and its two longest pieces of work, the
    input function and the training loop, in steps of at most 60: `build_dataset` reads as
    one tf.data chain, the decisions around it in functions of their own."""
    folder = os.path.join(ROOT, "components", "trainer")
    long = [f"{module}: {function}, {lines}" for module in sorted(os.listdir(folder))
            if module.endswith(".py")
            for function, lines in _functions(os.path.join(folder, module)) if lines > 80]
    assert long == []
    sizes = {(module, function): lines for module in ("input.py", "fit.py")
             for function, lines in _functions(os.path.join(folder, module))}
    assert sizes[("input.py", "build_dataset")] <= 60
    assert sizes[("fit.py", "train")] <= 60


def test_the_wheel_holds_the_product_alone(tmp_path):
    """`pip wheel --no-deps .` packs components/ and pipeline/, and neither bench/ nor
    testsupport/; `tfrp --help` then lists no benchmark (tests/test_cli.py)."""
    import subprocess
    import sys
    import zipfile

    import shutil

    # A copy of the checkout without what earlier builds and runs left (setuptools builds in
    # the source folder, and an old build/lib would add its stale files to the wheel).
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "*.egg-info", "__pycache__", "tfrp_runs", ".pytest_cache"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path), str(source)], check=True, capture_output=True,
                   cwd=str(tmp_path))
    (wheel,) = tmp_path.glob("tfrecord_pipeline-*.whl")
    tops = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert {"components", "pipeline"} <= tops
    assert not tops & {"bench", "testsupport", "tests"}, tops


# Which of our packages each may import (besides itself): the shard format at the bottom, the
# readers and the Spark glue on it, the components on all three, the pipeline on everything.
LIBRARIES = ("tfrecord_shards", "shard_readers", "spark_shards", "local_cluster")
MAY_IMPORT = {
    "tfrecord_shards": set(),
    "shard_readers": {"tfrecord_shards"},
    "spark_shards": {"tfrecord_shards"},
    "local_cluster": {"spark_shards", "tfrecord_shards"},
    "components": set(LIBRARIES),
    "pipeline": {"components", *LIBRARIES},
}


def test_no_import_runs_back_up_the_layers():
    graph = import_graph()
    wrong = sorted((name, target) for name, targets in graph.items()
                   if name.split(".")[0] in MAY_IMPORT for target in targets
                   if target.split(".")[0] != name.split(".")[0]
                   and target.split(".")[0] not in MAY_IMPORT[name.split(".")[0]])
    assert wrong == []


def test_components_holds_component_folders_alone():
    """Each entry at the top of components/ is `__init__.py` or a component's folder (its
    `component.py`, or the Trainer's: stock Trainer running our `module.py`'s run_fn); the
    shared pieces live in packages of their own."""
    top = [name for name in sorted(os.listdir(os.path.join(ROOT, "components")))
           if name != "__pycache__"]
    loose = [name for name in top if name != "__init__.py" and not any(
        os.path.isfile(os.path.join(ROOT, "components", name, entry))
        for entry in ("component.py", "module.py"))]
    assert len(top) > 5 and loose == []


def test_no_product_module_reads_a_fault_variable():
    """Faults come through components' hook points (tfrecord_shards/hooks.py), installed by
    the tests alone (testsupport/faults.py): no product module names a fault variable."""
    import re

    named = []
    for name, path in _modules().items():
        if name.split(".")[0] not in PRODUCT:
            continue
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        named += [(name, node.value) for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str)
                  and re.search(r"TFRP_\w*FAULT", node.value)]
    assert named == []


def test_the_readme_layout_names_every_package():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        layout = f.read().split("## Layout", 1)[1].split("\n## ", 1)[0]
    packages = [name for name in sorted(os.listdir(ROOT))
                if os.path.isfile(os.path.join(ROOT, name, "__init__.py"))]
    assert set(PACKAGES) <= set(packages)
    assert [name for name in packages if f"| `{name}/`" not in layout] == []
    components = [name for name in sorted(os.listdir(os.path.join(ROOT, "components")))
                  if os.path.isfile(os.path.join(ROOT, "components", name, "__init__.py"))]
    assert [name for name in components if f"`components/{name}/`" not in layout] == []


MAX_FUNCTION_LINES = 80


def test_no_product_function_is_over_80_lines():
    long = [(os.path.relpath(path, ROOT), function, lines) for path in _product_files()
            for function, lines in _functions(path)
            if lines > MAX_FUNCTION_LINES]
    assert long == []


def _local_imports_without_a_reason(path: str) -> list[int]:
    """Lines of imports inside functions with no comment on the line or above its group (the
    comment names the measured cost, or the rule that keeps the import there)."""
    with open(path, encoding="utf-8") as f:
        source = f.read()
    lines = source.split("\n")
    missing = []
    for function in ast.walk(ast.parse(source, path)):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(function):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            above = node.lineno - 2
            # Up through the group of imports (and blank lines, and a call such as
            # matplotlib.use between two of them) to the comment heading it.
            while above >= 0 and not lines[above].strip().startswith("#") and (
                    not lines[above].strip() or lines[above].strip().startswith(
                        ("import ", "from ", ")", "matplotlib.use")) or
                    lines[above].rstrip().endswith(",")):
                above -= 1
            if "#" not in lines[node.end_lineno - 1] and not (
                    above >= 0 and lines[above].strip().startswith("#")):
                missing.append(node.lineno)
    return missing


def test_every_local_import_in_the_product_says_why():
    """Imports sit at the top of a module; one inside a function carries a comment with its
    measured cost (or the rule that keeps it there)."""
    missing = [(os.path.relpath(path, ROOT), line) for path in _product_files()
               for line in _local_imports_without_a_reason(path)]
    assert missing == []


def test_the_local_import_checker_finds_one_without_a_reason(tmp_path):
    module = tmp_path / "module.py"
    module.write_text("def f():\n    # numpy: 0.2 s\n    import numpy\n\n\n"
                      "def g():\n    x = 1\n    import json\n    return json, x\n")
    assert _local_imports_without_a_reason(str(module)) == [8]
