"""The foundation: a real LocalDagRunner run on taxi data, the image pin, and the CLI."""
from __future__ import annotations

import csv
import os
import re
import subprocess
import sys

import pytest
import tensorflow as tf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.pipeline
def test_pipeline_registers_examples_schema_and_model(taxi_run):
    _, summary = taxi_run
    for type_name in ("Examples", "Schema", "TransformGraph", "Model", "ModelEvaluation",
                      "ModelBlessing", "PushedModel"):
        assert summary.artifacts.get(type_name), f"no {type_name} artifact in the store"
    assert set(summary.components) == {"ShardedExampleGen", "StatisticsGen", "ImportSchemaGen",
                                       "ExampleValidator", "ShardedTransform",
                                       "production_model", "Trainer", "Evaluator", "Pusher"}
    assert all(state == "ran" for state in summary.components.values())
    assert sum(summary.rows_per_split.values()) == 2000
    assert os.path.exists(summary.schema_path)


@pytest.mark.pipeline
def test_stock_statistics_and_schema_gen_consume_our_examples(taxi_run):
    """Stock StatisticsGen read our shards: its per-split counts equal our manifest's."""
    from tensorflow_data_validation.utils import stats_util

    from tfrecord_shards import shards

    _, summary = taxi_run
    examples = summary.artifacts["Examples"][0]
    manifest = shards.read_manifest(examples.uri)
    stats = summary.artifacts["ExampleStatistics"][0]
    for split, info in manifest["splits"].items():
        path = os.path.join(stats.uri, f"Split-{split}", "FeatureStats.pb")
        assert stats_util.load_stats_binary(path).datasets[0].num_examples == info["rows"]
    stock_schema = summary.schema_path
    with open(stock_schema) as f:
        text = f.read()
    assert 'name: "fare"' in text and "type: FLOAT" in text


@pytest.mark.pipeline
def test_pushed_model_scores_a_serialized_example(taxi_run, taxi_slice_dir):
    _, summary = taxi_run
    assert summary.pushed_model and os.path.isdir(summary.pushed_model)
    with open(os.path.join(taxi_slice_dir, "data.csv")) as f:
        rows = [next(csv.DictReader(f)) for _ in range(1)]

    def feature(value: str) -> tf.train.Feature:
        if value == "":
            return tf.train.Feature()
        try:
            return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(value)]))
        except ValueError:
            pass
        try:
            return tf.train.Feature(float_list=tf.train.FloatList(value=[float(value)]))
        except ValueError:
            return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value.encode()]))

    examples = [tf.train.Example(features=tf.train.Features(
        feature={k: feature(v) for k, v in row.items()})).SerializeToString() for row in rows]
    # An example with every feature missing must still score: gaps get schema defaults.
    examples.append(tf.train.Example().SerializeToString())
    model = tf.saved_model.load(summary.pushed_model)
    scores = model.signatures["serving_default"](examples=tf.constant(examples))
    probability = scores["probability"].numpy()
    assert probability.shape == (2, 1)
    assert ((probability >= 0) & (probability <= 1)).all()


def test_dockerfile_base_matches_the_pinned_python():
    """constraints.txt is pinned for Python 3.11 on glibc 2.36: Debian 12 (bookworm), whose
    python3 is 3.11. The image's base is a build argument defaulting to a bookworm image,
    and its one stage is built on it (the venv links to the base's python3.11)."""
    with open(os.path.join(ROOT, "constraints.txt")) as f:
        header = f.readline()
    python = re.search(r"Python (3\.\d+)", header).group(1)
    assert "glibc 2.36" in header  # bookworm's
    with open(os.path.join(ROOT, "Dockerfile")) as f:
        dockerfile = f.read()
    base = re.search(r"^ARG BASE_IMAGE=(\S+)$", dockerfile, re.M).group(1)
    assert base.endswith(":bookworm-slim"), base
    assert re.findall(r"^FROM (\S+)", dockerfile, re.M) == ["${BASE_IMAGE}"]
    assert f"python{python} -m venv /opt/venv" in dockerfile
    # No ENTRYPOINT: Kubeflow and Vertex run each task's own command.
    assert not re.search(r"^ENTRYPOINT", dockerfile, re.M)
    # The dependencies' layer comes before the source, so a code change reuses it.
    assert dockerfile.index("install-venv.sh --image") < dockerfile.index("COPY components")


# The image's Python: the python3.11 of Debian 12 (bookworm), the Dockerfile's base, and
# what a .venv made with that system's python3.11 runs on.
IMAGE_PYTHON = "3.11.2"
THIS_PYTHON = ".".join(map(str, sys.version_info[:3]))


def marker_environment(python: str, extra: str = "") -> dict[str, str]:
    """What an environment marker sees on `python` (a full version), for `extra`."""
    return {"python_full_version": python, "python_version": python.rsplit(".", 1)[0],
            "extra": extra}


def lock_pins() -> dict[str, tuple[str, str, object]]:
    """constraints.txt's pins: {normalized name: (version, the marks after it, its
    environment marker or None)}."""
    from packaging.markers import Marker
    from packaging.utils import canonicalize_name

    pins = {}
    with open(os.path.join(ROOT, "constraints.txt")) as f:
        for line in f:
            match = re.match(r"^([A-Za-z0-9_.\-]+)==([^\s;]+)\s*(?:;([^#]*))?(.*)$", line)
            if match:
                marker = Marker(match.group(3).strip()) if match.group(3) else None
                pins[canonicalize_name(match.group(1))] = (match.group(2), match.group(4), marker)
    return pins


def installed_here(marker) -> bool:
    return marker is None or marker.evaluate(marker_environment(THIS_PYTHON))


def test_the_lock_marks_exactly_the_releases_whose_metadata_excludes_this_python():
    """scripts/install-venv.sh gives pip the releases constraints.txt marks
    `requires-python-excluded` (uv cannot ignore Requires-Python) and uv the rest, here and
    in the image: a release marked wrongly, or one left unmarked, would fail the install or
    fall to the wrong tool. Each pin this Python installs is also what is installed (the
    lines marked `gpu-image-only` only the GPU image installs)."""
    import importlib.metadata
    from packaging.specifiers import SpecifierSet

    pins = lock_pins()
    marked = {name for name, (_, marks, _) in pins.items() if "requires-python-excluded" in marks}
    excluded = set()
    for name, (version, marks, marker) in pins.items():
        if not installed_here(marker) or "gpu-image-only" in marks:
            continue
        dist = importlib.metadata.distribution(name)
        assert dist.version in SpecifierSet(f"=={version}"), (name, dist.version, version)
        requires = dist.metadata.get("Requires-Python")
        if requires and any(version not in SpecifierSet(requires)
                            for version in (THIS_PYTHON, IMAGE_PYTHON)):
            excluded.add(name)
    assert marked and marked == excluded


def test_the_lock_marks_exactly_what_the_dev_extra_adds_to_the_install_requires():
    """The image installs the lines of constraints.txt not marked `dev-only`, with no
    resolver (scripts/install-venv.sh --image): they must be exactly the releases this
    project's install_requires need, as a resolver would walk them (requirements of
    requirements, their extras and environment markers), here over the installed metadata.
    A line marked wrongly would leave a test package in the image or a requirement out.
    Markers are read for this Python and for the image's, which is also Debian 12's: a
    requirement only one of them has (redis's async-timeout below 3.11.3) must be pinned,
    or an install on the other fails `pip check`. A pin this Python does not install is
    taken as having no requirements of its own (its metadata is not here to read).
    The lines marked `gpu-image-only` are what TensorFlow's `and-cuda` extra adds, at the
    versions it names (the GPU image's CUDA libraries; their own requirements are among
    them), and .venv installs none of them."""
    import importlib.metadata
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    pins = lock_pins()

    def closure(requirements: list[str]) -> set[str]:
        extras_of: dict[str, set[str]] = {}
        pending = [Requirement(line) for line in requirements]
        while pending:
            requirement = pending.pop()
            name = canonicalize_name(requirement.name)
            if name in extras_of and set(requirement.extras) <= extras_of[name]:
                continue
            extras = extras_of.setdefault(name, set())
            extras.update(requirement.extras)
            if (name not in pins or not installed_here(pins[name][2])
                    or "gpu-image-only" in pins[name][1]):
                continue  # unpinned (the assertion below names it), or no metadata here
            for line in importlib.metadata.requires(name) or []:
                child = Requirement(line)
                if child.marker is None or any(
                        child.marker.evaluate(marker_environment(python, extra))
                        for python in (THIS_PYTHON, IMAGE_PYTHON) for extra in {""} | extras):
                    child.marker = None
                    pending.append(child)
        return set(extras_of)

    own = [line for line in importlib.metadata.requires("tfrecord-pipeline")
           if Requirement(line).marker is None]
    dev_only = {name for name, (_, marks, _) in pins.items() if "dev-only" in marks}
    gpu_only = {name for name, (_, marks, _) in pins.items() if "gpu-image-only" in marks}
    needed = closure(own)
    assert needed <= set(pins), sorted(needed - set(pins))
    assert dev_only and sorted(dev_only) == sorted(set(pins) - needed - gpu_only)
    assert gpu_only and sorted(gpu_only) == sorted(closure(own + ["tensorflow[and-cuda]"])
                                                   - needed)
    for line in importlib.metadata.requires("tensorflow"):
        requirement = Requirement(line)
        name = canonicalize_name(requirement.name)
        if name in gpu_only:
            assert pins[name][0] in requirement.specifier, (line, pins[name][0])
    for name in gpu_only:
        with pytest.raises(importlib.metadata.PackageNotFoundError):
            importlib.metadata.distribution(name)


def test_cli_help_lists_commands():
    out = subprocess.run([sys.executable, "-m", "pipeline.cli", "--help"],
                         capture_output=True, text=True, check=True).stdout
    assert re.search(r"^\s+run\s", out, re.M), out
