"""`make test`'s own set-up: the system packages its tests need, checked before pytest runs."""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "scripts", "test-system-packages.sh")


# A script run by the unprivileged user nobody (root switches to it with setpriv).
AS_NOBODY = [shutil.which("setpriv") or "setpriv", "--reuid=nobody", "--regid=nogroup",
             "--clear-groups"]
needs_setpriv = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                                   reason="switching to an unprivileged user needs root and "
                                          "setpriv")


def _path_with(folder, names: list[str]) -> str:
    """A PATH that holds only `names` (linked from this machine's own), so the script sees a
    machine without the rest."""
    folder.mkdir()
    for name in names:
        os.symlink(shutil.which(name), folder / name)
    return str(folder)


@needs_setpriv
def test_a_user_who_cannot_install_is_told_the_packages_and_the_command_in_one_line():
    # pytest's own temporary folders are root's alone; this user must be able to enter it.
    with tempfile.TemporaryDirectory() as folder:
        os.chmod(folder, 0o755)
        path = _path_with(Path(folder) / "bin", ["bash", "id"])  # no chromium, java, sudo
        result = subprocess.run(
            [*AS_NOBODY, shutil.which("bash"), os.path.abspath(SCRIPT)],
            capture_output=True, text=True, env={"PATH": path}, timeout=60)
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        "make test needs the system packages chromium openjdk-17-jre-headless; install them "
        "with: sudo apt-get update && sudo apt-get install -y chromium "
        "openjdk-17-jre-headless"]


IMAGE_TOOLS = ["podman", "buildah", "mmdebstrap", "runc"]


@pytest.mark.skipif(any(shutil.which(name) is None for name in ["chromium", "java", *IMAGE_TOOLS]),
                    reason="the packages are installed by make test before the suite runs")
def test_nothing_is_done_when_the_packages_are_there(tmp_path):
    path = _path_with(tmp_path / "bin", ["bash", "id", "chromium", "java", *IMAGE_TOOLS])
    result = subprocess.run([shutil.which("bash"), SCRIPT], capture_output=True, text=True,
                            env={"PATH": path}, timeout=60)
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


BUILD_IMAGE = os.path.join(os.path.dirname(__file__), "..", "scripts", "build-image.sh")


def _docker_daemon_answers() -> bool:
    return subprocess.run(["docker", "info"], capture_output=True).returncode == 0


@pytest.mark.skipif(shutil.which("docker") is None or _docker_daemon_answers(),
                    reason="needs the docker command with no daemon behind it")
def test_make_image_with_docker_and_no_daemon_names_both_ways_out(tmp_path):
    """`make image` where the docker CLI is installed but no daemon runs: one line that says
    so and names both ways out, before docker's own "Cannot connect" would."""
    path = _path_with(tmp_path / "bin", ["bash", "dirname", "docker"])
    result = subprocess.run([shutil.which("bash"), BUILD_IMAGE], capture_output=True,
                            text=True, env={"PATH": path, "ENGINE": "docker"}, timeout=60)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.splitlines() == [
        "build-image: docker is installed but no Docker daemon answers: start it (sudo "
        "systemctl start docker), or build with podman, which needs no daemon: apt-get "
        "install podman buildah mmdebstrap runc (docs/DEPLOYMENT.md)"]


def test_make_image_with_neither_engine_names_the_packages(tmp_path):
    path = _path_with(tmp_path / "bin", ["bash", "dirname"])
    result = subprocess.run([shutil.which("bash"), BUILD_IMAGE], capture_output=True,
                            text=True, env={"PATH": path}, timeout=60)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "build-image: neither podman nor docker is installed: apt-get install podman buildah "
        "mmdebstrap runc (docs/DEPLOYMENT.md)"]


# A real table nobody here wrote (the taxi sample: whole and fractional numbers, text, gaps)
# through ExampleGen's and StatisticsGen's jobs, then numba's count of what each compiled
# loop loaded from the cache and what it had to compile.
_FIRST_RUN = """
import json, sys
from numba.core.registry import CPUDispatcher
from tfrecord_shards import fileio
from components.example_gen import engine
from components.example_gen.options import ExampleGenOptions
from components.statistics_gen import stats_job
source, work = sys.argv[1:]
fileio.makedirs(work + "/source")
fileio.write_text(work + "/source/trips.csv", fileio.read_text(source))
engine.run(ExampleGenOptions(source=work + "/source"), work + "/examples")
stats_job.run(work + "/examples", work + "/statistics",
              stats_job.artifact_splits(work + "/examples"))
# Each loop once: a module also holds the loops it imports from another.
loops = {id(value): value
         for name in ("tfrecord_shards.codec.wire", "tfrecord_shards.codec.framing",
                      "tfrecord_shards.codec.example_loops",
                      "components.example_gen.split_hash", "components.statistics_gen.kernels")
         for value in vars(sys.modules[name]).values() if isinstance(value, CPUDispatcher)}
hits = sum(sum(loop.stats.cache_hits.values()) for loop in loops.values())
misses = sum(sum(loop.stats.cache_misses.values()) for loop in loops.values())
print(json.dumps({"hits": hits, "misses": misses}))
"""


@pytest.mark.slow
def test_the_install_fills_numbas_cache_so_a_first_run_compiles_no_loop(tmp_path, taxi_csv):
    """`make install` (and the image build) run pipeline/jit_cache.py: a first ExampleGen
    and StatisticsGen on another table then load every compiled loop from numba's cache."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def python(cache: Path, *args: str) -> subprocess.CompletedProcess:
        done = subprocess.run([sys.executable, *args], capture_output=True, text=True,
                              env=dict(os.environ, NUMBA_CACHE_DIR=str(cache), PYTHONPATH=root),
                              cwd=root, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        return done

    def first_run(cache: Path, work: str) -> dict:
        done = python(cache, "-c", _FIRST_RUN, taxi_csv, str(tmp_path / work))
        return json.loads(done.stdout.strip().splitlines()[-1])

    # A first run without the cache compiling every loop is not run again here: it is what
    # a miss counts, and any loop jit_cache.py left out is a miss below.
    cache = tmp_path / "cache"
    filled = python(cache, "-m", "pipeline.jit_cache")
    assert filled.stderr.splitlines()[-1].startswith("numba cache filled in ")
    warm = first_run(cache, "warm")
    assert warm["misses"] == 0 and warm["hits"] > 0, warm


def test_a_build_waits_for_the_one_already_running_in_this_checkout(tmp_path):
    """scripts/build-image.sh holds IMAGE_LOCK for the whole build: a second one (the image
    tests' `make image` while `make test`'s background build runs) starts only after it.
    ENGINE=true stands in for podman's `build`, which is not what this checks."""
    lock = tmp_path / "image.lock"
    env = dict(os.environ, ENGINE="true", IMAGE_LOCK=str(lock))
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        waiting = subprocess.Popen([shutil.which("bash"), BUILD_IMAGE], env=env,
                                   stderr=subprocess.PIPE, text=True)
        with pytest.raises(subprocess.TimeoutExpired):
            waiting.wait(timeout=3)
    assert waiting.wait(timeout=60) == 0
    assert waiting.stderr.read().startswith("build-image: true build")


BESIDE = os.path.join(os.path.dirname(__file__), "..", "scripts", "image-beside.sh")


@needs_setpriv
def test_without_root_make_test_starts_no_image_build_and_keeps_the_exit_status():
    with tempfile.TemporaryDirectory() as folder:
        os.chmod(folder, 0o755)
        result = subprocess.run(
            [*AS_NOBODY, shutil.which("bash"), os.path.abspath(BESIDE), "bash", "-c", "exit 3"],
            capture_output=True, text=True, cwd=folder, timeout=60)
    assert (result.returncode, result.stdout, result.stderr) == (3, "", "")


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("podman") is None,
                    reason="image-beside.sh builds only where podman and root are")
def test_the_background_builds_exit_status_reaches_the_command(tmp_path):
    """The command (pytest, whose image tests then build again only when this failed) finds
    the build's exit status in the file IMAGE_BUILT_BESIDE names, once the build has ended.
    A `make` on PATH stands in for the build; the script runs from a copy, so this checkout's
    own build/ is left alone."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(BESIDE, tmp_path / "scripts" / "image-beside.sh")
    bin_folder = tmp_path / "bin"
    bin_folder.mkdir()
    fake_make = bin_folder / "make"
    fake_make.write_text("#!/bin/sh\nsleep 1\necho built $*\nexit 7\n")
    fake_make.chmod(0o755)
    wait_and_show = ('until [ -f "$IMAGE_BUILT_BESIDE" ]; do sleep 0.1; done; '
                     'cat "$IMAGE_BUILT_BESIDE"')
    result = subprocess.run(
        [shutil.which("bash"), str(tmp_path / "scripts" / "image-beside.sh"), "sh", "-c",
         wait_and_show], capture_output=True, text=True, timeout=60,
        env=dict(os.environ, PATH=f"{bin_folder}{os.pathsep}{os.environ['PATH']}"))
    assert result.returncode == 0, result.stderr
    assert result.stdout == "7\n"
    assert (tmp_path / "build" / "image.log").read_text() == \
        "built --no-print-directory image\n"
