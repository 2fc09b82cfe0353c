# Two entry points: `make run` and `make test`. Both (re)build .venv when it is
# missing or when setup.py / constraints.txt changed since the last install.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The container image Kubeflow and Vertex run; the compiled pipeline defaults to the same
# name and tag (pipeline/configs.py), and `tfrp compile --image-tag` changes it.
IMAGE ?= tfrecord-pipeline
IMAGE_TAG ?= 0.1.0
export TF_USE_LEGACY_KERAS := 1
export TF_CPP_MIN_LOG_LEVEL := 2

.PHONY: run test test-all test-quick install system-packages image image-gpu clean

install: $(STAMP)

# scripts/install-venv.sh installs the lock (uv, then pip for what uv refuses). The compiled
# loops go into numba's cache here, not in the first run (pipeline/jit_cache.py).
$(STAMP): setup.py constraints.txt scripts/install-venv.sh scripts/pip-settings.sh
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	bash scripts/install-venv.sh $(VENV)
	$(BIN)/python -m pipeline.jit_cache
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/tfrp run

# Chromium and a JRE, installed when missing and this user may; `make run` needs neither.
system-packages:
	@bash scripts/test-system-packages.sh

# The image tests' image builds in the background from the start (scripts/image-beside.sh
# says when and why), beside the .venv install and then the first tests.
test: system-packages
	@bash scripts/image-beside.sh $(MAKE) --no-print-directory test-all

# Hundreds of the tests' processes import our modules. Where PYTHONDONTWRITEBYTECODE is set
# (as on many CI machines) Python never writes their bytecode, so each process would compile
# them again (0.3 s of CPU a `tfrp` process); compiled once here, only edited files are redone.
COMPILE := $(BIN)/python -m compileall -q components pipeline tfrecord_shards shard_readers spark_shards local_cluster testsupport bench

test-all: $(STAMP)
	$(COMPILE)
	$(BIN)/python -m pytest

# The everyday tier: no root, no emulator, no image, no JRE, no whole pipeline (pytest.ini's
# markers say what each test needs); `make test` runs everything, as CI does.
QUICK := not (pipeline or object_store or image or spark or slow)
test-quick: $(STAMP)
	$(COMPILE)
	$(BIN)/python -m pytest -m "$(QUICK)"

# podman (or docker) builds the image; scripts/build-image.sh says how, and makes a Debian
# base with mmdebstrap when no registry is reachable.
image:
	IMAGE=$(IMAGE) IMAGE_TAG=$(IMAGE_TAG) bash scripts/build-image.sh

# The same image with TensorFlow's CUDA build and its CUDA libraries (constraints.txt's
# gpu-image-only pins), tagged <tag>-gpu: the name the compiler gives the Trainer's task
# when it asks for an accelerator.
image-gpu:
	IMAGE=$(IMAGE) IMAGE_TAG=$(IMAGE_TAG)-gpu bash scripts/build-image.sh \
		--build-arg 'TF_PACKAGE=tensorflow[and-cuda]'

clean:
	rm -rf tfrp_runs build .pytest_cache
