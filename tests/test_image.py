"""The image `make image` builds (Dockerfile, scripts/build-image.sh), run as a cluster runs
it: a task's own command, data mounted in, no network (the compiled pipeline's tasks: only
the object stores' private one, with its artifacts on gs://).

The module fixture builds the image with `make image`: minutes from nothing (a cold build
installs every dependency), a minute with podman's layer cache when only the code changed.
Under `make test` the build has started in the background before pytest
(scripts/image-beside.sh): the fixture waits for it and uses its image, and builds only when
that build failed.
"""
from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

from tfrecord_shards import tfrecord_io
from pipeline.configs import DEFAULT_IMAGE, DEFAULT_IMAGE_TAG

pytestmark = pytest.mark.image

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


def podman_run(*args: str, volumes: tuple = (), stores=None,
               timeout: float = 600) -> subprocess.CompletedProcess:
    """`args` in a container of the image with no network, or with `stores` (the
    object_stores fixture) only their private network: their host names, their folder
    (certificates, the service-account key) and their variables."""
    flags = [f"--volume={host}:{inside}" for host, inside in volumes]
    if stores is None:
        flags.append("--network=none")
    else:
        flags += [f"--network=ns:{stores.network_namespace}",
                  f"--volume={stores.hosts_file}:/etc/hosts:ro",
                  f"--volume={stores.work_dir}:{stores.work_dir}",
                  *(f"--env={name}={value}" for name, value in stores.env.items())]
    return subprocess.run(["podman", "run", "--rm", *flags, IMAGE, *args],
                          capture_output=True, text=True, env=_podman_env(), timeout=timeout)


def _built_beside(timeout: float = 3600, variable: str = "IMAGE_BUILT_BESIDE") -> bool:
    """Whether `make test`'s background build of this checkout (scripts/image-beside.sh,
    which names its exit status file in IMAGE_BUILT_BESIDE, the GPU image's in
    IMAGE_GPU_BUILT_BESIDE) built the image: waits for it."""
    status = os.environ.get(variable)
    if not status:
        return False
    deadline = time.monotonic() + timeout
    while not os.path.exists(status):
        if time.monotonic() > deadline:
            return False
        time.sleep(1)
    with open(status, encoding="utf-8") as f:
        return f.read().strip() == "0"


@pytest.fixture(scope="module")
def image() -> str:
    if _built_beside():
        return IMAGE
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
    # The compiler and binutils the dependencies' layer installs are purged within it (dash's
    # `command -v` reads one name).
    result = podman_run("sh", "-c", "for c in gcc cc c++ strip; do command -v $c; done; "
                        "python --version; java -version 2>&1 | head -1; "
                        "echo $TF_USE_LEGACY_KERAS")
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert lines[0].startswith("Python 3.11."), lines  # no compiler path printed before it
    assert '"17.' in lines[1], lines
    assert lines[2] == "1"


# Run as our entry points run (pipeline/process_exit.py): tensorflow-io's S3 client aborts
# a process's C exit once it has connected.
REACH_BOTH_STORES = """
import sys
from pipeline import process_exit
process_exit.install()
from tfrecord_shards import fileio, tf_filesystems
import tensorflow as tf

def reach():
    for bucket in sys.argv[1:]:
        tf_filesystems.register_for(bucket)
        with tf.io.gfile.GFile(bucket + "/gfile.txt", "w") as f:
            f.write(bucket)
        fileio.write_text(bucket + "/fileio.txt", bucket)
        print(fileio.read_text(bucket + "/gfile.txt"),
              tf.io.gfile.GFile(bucket + "/fileio.txt").read())

process_exit.run(reach)
"""


@pytest.mark.object_store
def test_tf_io_gfile_in_the_image_reaches_s3_and_gcs(image, object_stores):
    """The stock components write artifacts through tf.io.gfile, which has s3:// only from
    tensorflow-io's file-system plugin (the image keeps that plugin when it drops the rest of
    tensorflow-io), and our components through our file layer: in a container on the stores'
    private network, each reads on both stores what the other wrote."""
    buckets = [object_stores.make_bucket(scheme, "image-reach") for scheme in ("gs", "s3")]
    result = podman_run("python", "-c", REACH_BOTH_STORES, *buckets, stores=object_stores)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines()[-2:] == [f"{b} {b}" for b in buckets], result.stdout


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


COPY = ("import sys\nfrom tfrecord_shards import fileio\n"
        "if fileio.isdir(sys.argv[1]): fileio.copy_tree(sys.argv[1], sys.argv[2])\n"
        "elif fileio.exists(sys.argv[1]): fileio.copy_file(sys.argv[1], sys.argv[2])")
LIST_FOLDER = ("import json, sys\nfrom tfrecord_shards import fileio\n"
               "print(json.dumps(fileio.listdir(sys.argv[1]) if fileio.exists(sys.argv[1]) "
               "else []))")


@pytest.mark.object_store
@pytest.mark.pipeline
def test_the_compiled_pipeline_runs_in_the_image_as_open_source_kfp_runs_it(
        image, object_stores, taxi_slice_dir, tmp_path):
    """The compiled spec run task by task as open-source Kubeflow Pipelines runs it
    (tests/kfp_launch.py, `kfp-oss`: input artifacts without their types, as its driver
    rebuilds them from ML Metadata), every task's command in the image, with the data, the
    pipeline root and the serving folder on gs://, Vertex's store: each container joins the
    object stores' private network (the GCS emulator under Google's host names and the
    metadata server's service-account login, as on Vertex) and nothing else. Every task
    succeeds and the model is pushed to the bucket. Each store runs one whole pipeline a
    suite: s3:// runs it on LocalDagRunner (tests/test_object_storage.py); the image's two
    file layers read and write s3:// in `test_tf_io_gfile_in_the_image_reaches_s3_and_gcs`."""
    scheme = "gs"
    import kfp_launch

    bucket = object_stores.make_bucket(scheme, "kfp-image")
    outputs = tmp_path / "outputs"
    outputs.mkdir()

    def execute(command: list[str], task_image: str, env: dict) -> subprocess.CompletedProcess:
        assert task_image == image and not env, env  # a gs:// root: no env in the spec
        assert command[:3] == ["python", "-m", "pipeline.task_entrypoint"], command[:3]
        result = podman_run(*command, volumes=((outputs, outputs),), stores=object_stores,
                            timeout=900)
        if result.returncode:
            print(result.stderr[-5000:])
        return result

    def list_folder(uri: str) -> list[str]:
        listed = object_stores.run([sys.executable, "-c", LIST_FOLDER, uri], cwd=ROOT,
                                   timeout=300)
        assert listed.returncode == 0, listed.stderr[-3000:]
        return json.loads(listed.stdout)

    def copy(source: str, destination: str) -> None:
        """The launcher's copy, made inside the stores' network as the pod makes it."""
        copied = object_stores.run([sys.executable, "-c", COPY, source, destination],
                                   cwd=ROOT, timeout=300)
        assert copied.returncode == 0, copied.stderr[-3000:]

    # The 2,000-trip slice on the bucket and a short training with the bounds at 0, as in
    # tests/test_object_storage.py's runs: what this asserts is that every task runs in the
    # image and a model is pushed, not how good it is (tests/test_kfp_local.py's runs are
    # blessed and refused on their merits).
    copy(taxi_slice_dir, f"{bucket}/data")
    spec = str(tmp_path / "pipeline.json")
    compiled = object_stores.run(
        [sys.executable, "-m", "pipeline.cli", "compile", "--output", spec,
         "--pipeline-root", f"{bucket}/root", "--data-root", f"{bucket}/data",
         "--set", f"serving_dir={bucket}/serving", "--train-steps", "20", "--eval-steps", "2",
         "--set", "min_accuracy=0", "--set", "min_auc=0"],
        cwd=str(tmp_path), env={"TF_CPP_MIN_LOG_LEVEL": "3"}, timeout=600)
    assert compiled.returncode == 0, compiled.stderr[-3000:]

    # With every task's cache forced on at submit and the executor-logs output of the
    # default install (kfp_launch's defaults).
    run = kfp_launch.run_spec(spec, f"{bucket}/root", execute, str(outputs),
                              mode=kfp_launch.KFP_OSS, copy=copy,
                              cache_dir=str(tmp_path / "kfp-cache"), enable_caching=True)
    assert len(run) == 10 and all(t.startswith(f"{bucket}/root/") for t in run.values())
    written = kfp_launch.executor_output(run, "Evaluator")
    (blessing,) = written["artifacts"]["blessing"]["artifacts"]
    assert blessing["metadata"]["blessed"] == 1
    (version,) = list_folder(f"{bucket}/serving")
    assert "saved_model.pb" in list_folder(f"{bucket}/serving/{version}")
    # The launcher's local copies of input artifacts, as open-source KFP makes them.
    assert list(outputs.glob(f"*/Trainer/pod/{'gcs' if scheme == 'gs' else 's3'}"))
    assert not any(p.name.startswith(f"{scheme}:") for p in tmp_path.rglob("*"))


# The GPU image (`make image-gpu`): the same Dockerfile and code with TensorFlow's CUDA build
# and the NVIDIA wheels constraints.txt pins as gpu-image-only. No GPU is needed for what
# these check: TensorFlow is the CUDA build, the CUDA libraries load by the names TensorFlow
# opens them by (TensorFlow itself finds the CUDA runtime), and it imports and lists no GPU
# without failing where there is none. bench/gpu_machine.sh checks it on a GPU.
GPU_IMAGE = f"{DEFAULT_IMAGE}:{DEFAULT_IMAGE_TAG}-gpu"


@pytest.fixture(scope="module")
def gpu_image() -> str:
    """`make image-gpu`'s image: under `make test` built in the background after the CPU
    image (scripts/image-beside.sh), else built here (about 10 minutes cold on 2 cores)."""
    if _built_beside(variable="IMAGE_GPU_BUILT_BESIDE"):
        return GPU_IMAGE
    result = subprocess.run(["make", "image-gpu"], cwd=ROOT, capture_output=True, text=True,
                            env=_podman_env(), timeout=3600)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    return GPU_IMAGE


def gpu_image_run(image: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", "run", "--rm", "--network=none", image, *args],
                          capture_output=True, text=True, env=_podman_env(), timeout=timeout)


# TensorFlow in the GPU image: what it was built with, what it finds, then the CUDA libraries
# (argv) opened by name and what the runtime and cuDNN answer without a GPU.
CUDA_IN_TENSORFLOW = r"""
import ctypes, json, os, subprocess, sys
import tensorflow as tf

def mapped():
    with open("/proc/self/maps") as f:
        return sorted({line.split()[-1] for line in f if "/nvidia/" in line})

gpus = tf.config.list_physical_devices("GPU")
found_by_tensorflow = mapped()
for name in sys.argv[1:]:
    ctypes.CDLL(name)
cudart, cudnn = ctypes.CDLL("libcudart.so.12"), ctypes.CDLL("libcudnn.so.8")
runtime = ctypes.c_int()
status = cudart.cudaRuntimeGetVersion(ctypes.byref(runtime))
cudnn.cudnnGetVersion.restype = ctypes.c_size_t
try:
    ctypes.CDLL("libcuda.so.1")
    driver = True
except OSError:
    driver = False
site = os.path.dirname(os.path.dirname(tf.__file__))
ptxas = subprocess.run([site + "/nvidia/cuda_nvcc/bin/ptxas", "--version"],
                       capture_output=True, text=True).stdout
print(json.dumps({"build": dict(tf.sysconfig.get_build_info()), "gpus": [d.name for d in gpus],
                  "found_by_tensorflow": found_by_tensorflow, "loaded": mapped(),
                  "site": site, "ptxas": ptxas,
                  "runtime": [status, runtime.value], "cudnn": cudnn.cudnnGetVersion(),
                  "driver": driver}, default=str))
"""


# The wheels' libraries, by folder: what TensorFlow opens (the runtime, cuBLAS, cuFFT,
# cuSOLVER, cuSPARSE, cuDNN, NCCL, the profiler's CUPTI) and what they open (nvJitLink, NVRTC).
CUDA_LIBRARIES = {"cuda_runtime": "libcudart.so.12", "cublas": "libcublasLt.so.12",
                  "cufft": "libcufft.so.11", "cusolver": "libcusolver.so.11",
                  "cusparse": "libcusparse.so.12", "nvjitlink": "libnvJitLink.so.12",
                  "cudnn": "libcudnn.so.8", "nccl": "libnccl.so.2",
                  "cuda_cupti": "libcupti.so.12", "cuda_nvrtc": "libnvrtc.so.12",
                  "curand": "libcurand.so.10"}


def test_the_gpu_image_runs_tensorflows_cuda_build_and_loads_its_cuda_libraries(gpu_image):
    result = gpu_image_run(gpu_image, "python", "-c", CUDA_IN_TENSORFLOW,
                           *CUDA_LIBRARIES.values())
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.splitlines()[-1])
    build = report["build"]
    assert build["is_cuda_build"] is True, build
    assert (build["cuda_version"], build["cudnn_version"]) == ("12.3", "8"), build
    # No GPU here, and no driver in the image (the node's driver is mounted in at run time):
    # TensorFlow lists none, without failing.
    assert report["gpus"] == [] and report["driver"] is False, report
    nvidia = os.path.join(report["site"], "nvidia")
    # TensorFlow found the wheels' CUDA runtime on its own, and every library loads by name
    # (the image's loader path, ld.so.conf.d) from the wheels' folders.
    assert f"{nvidia}/cuda_runtime/lib/libcudart.so.12" in report["found_by_tensorflow"], report
    for folder, library in CUDA_LIBRARIES.items():
        assert f"{nvidia}/{folder}/lib/{library}" in report["loaded"], (library, report)
    assert report["runtime"] == [0, 12030], report  # cudaSuccess, CUDA 12.3
    assert report["cudnn"] == 8907, report  # cuDNN 8.9.7
    # XLA's PTX assembler, where TensorFlow looks for it (beside its own folder).
    assert "release 12.3" in report["ptxas"], report


LOCK_PIN = re.compile(r"^([A-Za-z0-9_.\-]+)==([^\s;]+)[^#]*(#.*)?$")
INSTALLED = ("import importlib.metadata as m, json\n"
             "print(json.dumps({d.metadata['Name'].lower().replace('_', '-'): d.version "
             "for d in m.distributions()}))")


def test_the_gpu_image_holds_the_cpu_images_set_with_tensorflows_cuda_build(image, gpu_image):
    """The GPU image installs what the CPU image does, at the same versions, except the
    TensorFlow wheel (the lock's `tensorflow` for `tensorflow-cpu`) and the lines of
    constraints.txt marked gpu-image-only, each at its pin; the CPU image has none of them."""
    pins, gpu_only = {}, {}
    with open(os.path.join(ROOT, "constraints.txt"), encoding="utf-8") as f:
        for line in f:
            match = LOCK_PIN.match(line)
            if match:
                name = re.sub(r"[-_.]+", "-", match.group(1).lower())
                pins[name] = match.group(2)
                if "gpu-image-only" in (match.group(3) or ""):
                    gpu_only[name] = match.group(2)
    sets = {}
    for name, tag in (("cpu", image), ("gpu", gpu_image)):
        result = gpu_image_run(tag, "python", "-c", INSTALLED)
        assert result.returncode == 0, result.stderr[-3000:]
        sets[name] = json.loads(result.stdout)
    cpu, gpu = sets["cpu"], sets["gpu"]
    assert len(gpu_only) == 12 and not any(name.startswith("nvidia") for name in cpu)
    assert {name: gpu[name] for name in gpu_only} == gpu_only
    assert cpu.pop("tensorflow-cpu") == gpu.pop("tensorflow") == pins["tensorflow"]
    assert "tensorflow" not in cpu and "tensorflow-cpu" not in gpu
    assert {name: v for name, v in gpu.items() if name not in gpu_only} == cpu


def test_tfrp_help_runs_in_the_gpu_image(gpu_image):
    result = gpu_image_run(gpu_image, "tfrp", "--help")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "  run " in result.stdout and "  compile " in result.stdout, result.stdout
