#!/usr/bin/env bash
# `python -m bench gpu-feed` on a GPU machine that has PyTorch (and torchvision) but no TensorFlow
# and no package index: the runs docs/USER_GUIDE.md ("Feeding a GPU from PyTorch or JAX")
# names, each saved as JSON and shown as a table.
#
#   bench/gpu_machine.sh fetch [WHEELS]
#       On a machine with a package index: the four wheels such a machine lacks, for its
#       Python (PYTHON_VERSION, 3.12 by default) on x86-64 Linux, into WHEELS (.whl).
#   bench/gpu_machine.sh run OUT
#       On the GPU machine, from the repository root: installs the wheels (WHEELS, .whl) into
#       a temporary folder where the modules are missing, then runs the tabular MLPs and
#       ResNet-50 (each decode), writing machine.txt and <run>.json under OUT (six files) and
#       each run's table to stdout. First it checks TensorFlow on the GPU as the GPU image
#       (`make image-gpu`) runs it: where nvidia-smi answers and a TensorFlow built with CUDA
#       imports, TensorFlow must list the GPU and run a matmul on it (a failure fails the
#       status; the runs still run); otherwise one line says why the check is skipped. Its
#       line goes into machine.txt.
#       SCALE=N divides the rows and images by N (SCALE=10 checks the path in a minute);
#       DECODES ("cpu gpu raw") picks the image decodes, each a run of its own, so that one
#       that fails does not take the others with it (the status says whether any failed);
#       MODEL (resnet50) the image model; MLPS ("128-64 1024x3") the tabular MLPs;
#       IMAGE_SIZE (256) and CROP (224) the images' side and the model's input side.
set -euo pipefail

PYTHON=${PYTHON:-python3}
# The versions constraints.txt pins: their Python 3.12 wheels exist and read our shards.
WHEELS_PINNED=(tensorflow-metadata==1.16.1 google-crc32c==1.9.0 isal==1.7.1)
# tfx only for the taxi sample the tabular rows are drawn from; its own dependencies are not
# installed, and its wheel declares Python < 3.11.
TFX_PINNED=tfx==1.16.0

fetch() {
    local wheels=${1:-.whl} version=${PYTHON_VERSION:-3.12}
    mkdir -p "$wheels"
    "$PYTHON" -m pip download -q --no-deps --only-binary=:all: -d "$wheels" \
        --python-version "$version" --implementation cp --platform manylinux_2_28_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 "${WHEELS_PINNED[@]}"
    "$PYTHON" -m pip download -q --no-deps --only-binary=:all: -d "$wheels" \
        --python-version 3.10 "$TFX_PINNED"
    ls -l "$wheels"
}

# TensorFlow's CUDA build on the GPU (the GPU image's: tensorflow[and-cuda] at the lock's pin),
# in one line; status 1 only where such a TensorFlow is here and fails on the GPU.
TF_GPU_CHECK='
import sys, time
try:
    import tensorflow as tf
except ImportError as error:
    sys.exit(print(f"tensorflow gpu: skipped, TensorFlow is not importable here ({error})"))
if not tf.test.is_built_with_cuda():
    sys.exit(print(f"tensorflow gpu: skipped, TensorFlow {tf.__version__} is not a CUDA build"))
import numpy as np
gpus = tf.config.list_physical_devices("GPU")
if not gpus:
    sys.exit(print(f"tensorflow gpu: FAILED, TensorFlow {tf.__version__} lists no GPU") or 1)
a = np.random.default_rng(0).standard_normal((2048, 2048), dtype=np.float32)
with tf.device("/GPU:0"):
    x = tf.constant(a)
    tf.matmul(x, x).numpy()  # the first: kernels loaded
    start = time.perf_counter()
    product = tf.matmul(x, x)
    result = product.numpy()
    took = time.perf_counter() - start
# TF32 (Ampere and later) keeps the product within a percent of float32 arithmetic.
ok = product.device.endswith("GPU:0") and np.allclose(result, a @ a, rtol=1e-2, atol=0.5)
verdict = "ok" if ok else "FAILED, wrong product or device"
print(f"tensorflow gpu: {verdict}, TensorFlow {tf.__version__} lists {len(gpus)} GPU(s); "
      f"a 2048x2048 matmul on {product.device}: {took * 1000:.1f} ms")
sys.exit(0 if ok else 1)
'
tf_gpu() {
    if ! nvidia-smi -L >/dev/null 2>&1; then
        echo "tensorflow gpu: skipped, nvidia-smi does not answer (no GPU or no driver here)"
        return 0
    fi
    local log line status=0
    log=$(mktemp)
    line=$(TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2} "$PYTHON" -c "$TF_GPU_CHECK" \
           2>"$log") || status=$?
    echo "${line:-tensorflow gpu: FAILED (status $status)}"
    [ "$status" -eq 0 ] || [ -n "$line" ] || tail -5 "$log"  # it ended before its line
    rm -f "$log"
    return "$status"
}

run() {
    local out=$1 wheels=${WHEELS:-.whl} scale=${SCALE:-1}
    mkdir -p "$out"
    if ! "$PYTHON" -c "import tensorflow_metadata, google_crc32c, isal, importlib.util as u
assert u.find_spec('tfx')" 2>/dev/null; then
        local site
        site=$(mktemp -d)
        "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
            --ignore-requires-python --target "$site" "$wheels"/*.whl
        export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
    fi
    export PYTHONUNBUFFERED=1
    {
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
        echo "cores: $(nproc)"
        "$PYTHON" -c "import sys, numpy, pyarrow, torch
print('python', sys.version.split()[0], 'numpy', numpy.__version__, 'pyarrow',
      pyarrow.__version__, 'torch', torch.__version__)"
    } > "$out/machine.txt" 2>&1
    local failed=0
    tf_gpu >> "$out/machine.txt" || failed=1
    cat "$out/machine.txt"
    local workers=$(( $(nproc) - 1 )) work
    work=$(mktemp -d)
    one() {
        local name=$1
        shift
        echo "== $name: python -m bench gpu-feed $*" >&2
        if ! "$PYTHON" -m bench gpu-feed --work-dir "$work" --workers "$workers" \
                "$@" --json > "$out/$name.json"; then
            echo "== $name failed" >&2
            rm -f "$out/$name.json"
            failed=1
            return
        fi
        "$PYTHON" -c "import json, sys
from bench import display, gpu_feed
print('\n'.join(display.format_table(gpu_feed.table(json.load(open(sys.argv[1]))))))" \
            "$out/$name.json"
    }
    local rows=$(( 4000000 / scale )) images=$(( 20000 / scale ))
    local mlp
    for mlp in ${MLPS:-128-64 1024x3}; do
        case $mlp in
            128-64) one mlp-128-64 --rows "$rows" --batch-size 8192 --hidden 128,64 ;;
            1024x3) one mlp-1024x3 --rows "$rows" --batch-size 8192 --hidden 1024,1024,1024 ;;
            *) echo "MLPS: $mlp is not one of 128-64 1024x3" >&2; return 2 ;;
        esac
    done
    local decode
    for decode in ${DECODES:-cpu gpu raw}; do
        one "${MODEL:-resnet50}-$decode" --workload images --model "${MODEL:-resnet50}" \
            --decode "$decode" \
            --images "$images" --image-size "${IMAGE_SIZE:-256}" --crop "${CROP:-224}" \
            --batch-size 256
    done
    return "$failed"
}

case ${1:-} in
    fetch) shift; fetch "$@" ;;
    run) [[ $# -eq 2 ]] || { echo "usage: [SCALE=N] [WHEELS=.whl] $0 run OUT" >&2; exit 2; }
         run "$2" ;;
    *) echo "usage: $0 fetch [WHEELS] | [SCALE=N] [WHEELS=.whl] $0 run OUT" >&2; exit 2 ;;
esac
