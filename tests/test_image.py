"""The image `make image` builds (Dockerfile, scripts/build-image.sh), run as a cluster runs
it: a task's own command, data mounted in, no network (the compiled pipeline's tasks: only
the object stores' private one, with its artifacts on gs://).

The module fixture builds the image with `make image`: minutes from nothing (a cold build
installs every dependency), seconds with podman's layer cache when only the code changed.
"""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys

import pytest

from components import tfrecord_io
from pipeline.configs import DEFAULT_IMAGE, DEFAULT_IMAGE_TAG

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMAGE = f"{DEFAULT_IMAGE}:{DEFAULT_IMAGE_TAG}"

if shutil.which("podman") is None or os.geteuid() != 0:
    # One line in the summary for the whole file.
    pytest.skip("the image tests need podman and root (apt-get install podman buildah "
                "mmdebstrap runc)", allow_module_level=True)


def _podman_env() -> dict:
    env = dict(os.environ)
    # The settings `make image` builds with (runc, ulimits, no network); see the file.
    if "CONTAINERS_CONF" not in env and shutil.which("runc"):
        env["CONTAINERS_CONF"] = os.path.join(ROOT, "scripts", "containers.conf")
    return env


def podman_run(*args: str, volumes: tuple = ()) -> subprocess.CompletedProcess:
    flags = [f"--volume={host}:{inside}" for host, inside in volumes]
    return subprocess.run(["podman", "run", "--rm", "--network", "none", *flags, IMAGE, *args],
                          capture_output=True, text=True, env=_podman_env(), timeout=600)


@pytest.fixture(scope="module")
def image() -> str:
    result = subprocess.run(["make", "image"], cwd=ROOT, capture_output=True, text=True,
                            env=_podman_env(), timeout=3600)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    return IMAGE


def test_tfrp_help_runs_without_a_network(image):
    result = podman_run("tfrp", "--help")
    assert result.returncode == 0, result.stderr[-3000:]
    for command in ("run", "compile", "examplegen", "inspect"):
        assert f"  {command} " in result.stdout, result.stdout


def test_the_image_has_no_compiler_and_the_pinned_python(image):
    result = podman_run("sh", "-c", "command -v gcc cc c++ || true; python --version; java "
                        "-version 2>&1 | head -1; echo $TF_USE_LEGACY_KERAS")
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert lines[0].startswith("Python 3.11."), lines  # no compiler path printed before it
    assert '"17.' in lines[1], lines
    assert lines[2] == "1"


def test_tf_io_gfile_in_the_image_reaches_s3_and_gcs(image):
    """The stock components write s3:// artifacts through tf.io.gfile, which has s3:// only
    from tensorflow-io's file-system plugin: the image keeps that plugin when it drops the
    rest of tensorflow-io."""
    result = podman_run("python", "-c", "from components import tf_filesystems; "
                        "import tensorflow as tf; "
                        "print(tf_filesystems.register_for('s3://b/p')); "
                        "print(sorted(tf.io.gfile.get_registered_schemes()))")
    assert result.returncode == 0, result.stderr[-3000:]
    loaded, schemes = result.stdout.splitlines()[-2:]
    assert loaded == "True" and "'s3'" in schemes and "'gs'" in schemes, result.stdout


def test_examplegen_in_the_container_writes_every_source_row(image, taxi_slice_dir, tmp_path):
    source = os.path.join(taxi_slice_dir, "data.csv")
    with open(source, encoding="utf-8") as f:
        rows = sum(1 for _ in f) - 1  # the header
    out = tmp_path / "out"
    out.mkdir()
    result = podman_run("tfrp", "examplegen", "/data/data.csv", "/out/examples",
                        "--num-shards", "2", "--compression", "none",
                        volumes=((taxi_slice_dir, "/data:ro"), (str(out), "/out")))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "quarantined: 0 " in result.stdout, result.stdout
    shards = sorted(glob.glob(str(out / "examples" / "Split-*" / "data_tfrecord-*")))
    assert {os.path.basename(os.path.dirname(s)) for s in shards} == {"Split-train",
                                                                      "Split-eval"}
    assert sum(tfrecord_io.count_records(s) for s in shards) == rows == 2000


def test_spark_examplegen_runs_its_jvm_in_the_container(image, taxi_slice_dir, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    result = podman_run("tfrp", "examplegen", "/data/data.csv", "/out/examples",
                        "--engine", "spark", "--spark-master", "local[2]", "--num-shards", "2",
                        volumes=((taxi_slice_dir, "/data:ro"), (str(out), "/out")))
    assert result.returncode == 0, result.stderr[-3000:]
    shards = glob.glob(str(out / "examples" / "Split-*" / "data_tfrecord-*"))
    assert sum(tfrecord_io.count_records(s) for s in shards) == 2000


LIST_FOLDER = ("import json, sys\nfrom components import fileio\n"
               "print(json.dumps(fileio.listdir(sys.argv[1]) if fileio.exists(sys.argv[1]) "
               "else []))")


def test_the_compiled_pipeline_runs_in_the_image_on_gcs_pushes_then_refuses_a_worse_model(
        image, object_stores, tmp_path):
    """The compiled spec run task by task as KFP's launcher runs it (tests/kfp_launch.py),
    every task's command in the image, with the pipeline roots and the serving folder on
    gs://: each container joins the object stores' private network (the GCS emulator under
    Google's host names, its CA, the metadata server's service-account login, as on Vertex)
    and nothing else. The first run pushes to the bucket; the second (one training step) is
    compared with that push and refused."""
    import json

    import kfp_launch

    bucket = object_stores.make_bucket("gs", "kfp-image")
    outputs = tmp_path / "outputs"
    container_env = [f"--env={name}={value}" for name, value in object_stores.env.items()]

    def execute(command: list[str], task_image: str) -> int:
        assert task_image == image
        assert command[:3] == ["python", "-m", "pipeline.task_entrypoint"], command[:3]
        result = subprocess.run(
            ["podman", "run", "--rm", f"--network=ns:{object_stores.network_namespace}",
             f"--volume={object_stores.hosts_file}:/etc/hosts:ro",
             f"--volume={object_stores.work_dir}:{object_stores.work_dir}",
             f"--volume={outputs}:{outputs}", *container_env, image, *command],
            capture_output=True, text=True, env=_podman_env(), timeout=900)
        if result.returncode:
            print(result.stderr[-5000:])
        return result.returncode

    def list_folder(uri: str) -> list[str]:
        listed = object_stores.run([sys.executable, "-c", LIST_FOLDER, uri], cwd=ROOT,
                                   timeout=300)
        assert listed.returncode == 0, listed.stderr[-3000:]
        return json.loads(listed.stdout)

    outputs.mkdir()
    runs = kfp_launch.run_twice(f"{bucket}/kfp", execute, outputs_dir=str(outputs),
                                list_folder=list_folder)
    (first, first_pushed), (worse, pushed) = runs

    def metadata(tasks: dict, task: str, key: str, run: str) -> dict:
        written = kfp_launch.executor_output(tasks, task, str(outputs / run))
        (artifact,) = written["artifacts"][key]["artifacts"]
        return artifact["metadata"]

    assert metadata(first, "Evaluator", "blessing", "first")["blessed"] == 1
    assert len(first_pushed) == 1
    version = f"{bucket}/kfp/serving/{first_pushed[0]}"
    assert "saved_model.pb" in list_folder(version)
    assert metadata(worse, "production_model", "model", "worse")["pushed_model"] == version
    assert metadata(worse, "Evaluator", "blessing", "worse")["blessed"] == 0
    assert pushed == first_pushed
