# The image Kubeflow Pipelines and Vertex AI run (`make image`; docs: README, "The image").
#
# The base is Debian 12 (bookworm), whose python3 is 3.11: the Python constraints.txt is
# pinned for (glibc 2.36, cp311 wheels). TFX's own image (gcr.io/tfx-oss-public/tfx:1.16.0)
# is Python 3.10, which six of our pins have no wheel for, and sets an ENTRYPOINT. Any
# bookworm image with apt works as BASE_IMAGE; scripts/build-image.sh makes one with mmdebstrap
# when the default cannot be pulled. The venv's python is a link to the base's
# /usr/bin/python3.11.
ARG BASE_IMAGE=docker.io/library/debian:bookworm-slim

# One stage: the venv is installed where it runs, and the compiler that builds the pins that
# have no wheel and a C extension (pyfarmhash, crcmod) is installed and purged within that
# layer. A builder stage copied into the image cost a second 2.5 GB layer to write and hash
# (bench/RESULTS.md, "The image").
FROM ${BASE_IMAGE}
# Java for ExampleGen's Spark engine (pyspark runs its JVM in the container); Spark 3.5
# supports Java 8, 11 and 17. The man folder must exist for the JRE's update-alternatives.
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && apt-get install -y --no-install-recommends \
        ca-certificates python3.11 python3.11-venv openjdk-17-jre-headless \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/*
ENV PATH=/opt/venv/bin:$PATH \
    VIRTUAL_ENV=/opt/venv \
    TF_USE_LEGACY_KERAS=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# Where pip finds packages: PyPI unless these are given (scripts/build-image.sh passes the
# building machine's own pip settings, with their local folders mounted read-only).
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_FIND_LINKS
ARG PIP_CERT
# Dependencies only (the lines of constraints.txt not marked dev-only: setup.py's
# install_requires, already resolved), before any source: a code change reuses this layer.
# scripts/install-venv.sh --image installs them as it installs .venv (uv, then pip for the
# releases uv cannot install on this Python), with nothing to resolve: pip's resolution of
# this set took two thirds of its install (bench/RESULTS.md, "the image's install with uv").
# TF_PACKAGE=tensorflow-cpu (the default) installs, for the lock's TensorFlow, the CPU-only
# wheel of the same version (the same `tensorflow` module without the CUDA kernels, which
# this image has no CUDA libraries to run: 951 MiB installed against 1,701 MiB);
# --build-arg TF_PACKAGE=tensorflow installs the wheel the constraints pin, and
# TF_PACKAGE=tensorflow[and-cuda] (`make image-gpu`) that wheel with its CUDA libraries, the
# NVIDIA wheels constraints.txt pins as gpu-image-only (CUDA runtime, cuDNN, cuBLAS ...).
ARG TF_PACKAGE=tensorflow-cpu
COPY constraints.txt /tmp/deps/
COPY scripts/install-venv.sh scripts/pip-settings.sh /tmp/deps/scripts/
# What no run uses: TensorFlow's C++ headers (for building custom ops), tensorflow-io's op
# libraries (150 MB; only its file-system plugins, libtensorflow_io_plugins.so, are loaded: s3://
# for tf.io.gfile), the packages' own test
# suites, debug sections of the shared libraries (strip, from binutils, which g++ brings and
# which is named in the purge: apt keeps it as python3.11 suggests it), and DROP_PACKAGES,
# never installed: requirements
# of requirements but used only by TensorFlow's build tools (libclang), a notebook server
# (widgetsnbextension's jupyterlab and notebook) or an interactive shell's completion (jedi);
# `pip check` names them as missing. Bytecode is kept for the modules the pipeline's steps
# import (compiled here by importing them), not for all 250 packages (0.4 GB).
ARG DROP_PACKAGES="libclang jupyterlab notebook jupyterlab-server jupyter-server jupyter-lsp \
notebook-shim babel jedi parso"
# One RUN, so one layer: the venv, the install and what is then taken out of them are never
# committed apart (a layer of the whole install, then one rewriting every stripped library,
# cost 3.5 GB and 1.7 GB of layer writes; a layer of the new venv alone kept 23 MB, pip's and
# setuptools' files and bytecode that this one replaces or deletes), and nothing is
# byte-compiled by the install: the imports at the end compile only what the steps load.
# g++ builds the pins that have no wheel and a C extension (pyfarmhash, crcmod).
# The GPU image's NVIDIA wheels (site-packages/nvidia) are left whole, and their lib folders
# go into the loader's path (ld.so.conf.d), as a CUDA install's would: a library opened by
# name is looked for in the opening module's RUNPATH alone, and TensorFlow's modules name
# most of those folders, not all (cuRAND; NVRTC, which cuDNN's runtime-compiled kernels open
# and whose RUNPATH names nvrtc/lib where the wheel installs cuda_nvrtc/lib).
RUN python3.11 -m venv /opt/venv \
    && apt-get update \
    && apt-get install -y --no-install-recommends g++ python3.11-dev \
    && bash /tmp/deps/scripts/install-venv.sh --image /opt/venv \
    && cd / && rm -rf /tmp/deps \
    && cd /opt/venv/lib/python3.11/site-packages \
    && rm -rf tensorflow/include \
    && rm -f tensorflow_io/python/ops/libtensorflow_io.so \
        tensorflow_io/python/ops/libtensorflow_io_golang.so \
        tensorflow_io/python/ops/libtensorflow_io_ffmpeg_*.so tensorflow_io/core/libavro_atds_tests.so \
    && find . -path ./nvidia -prune -o -type d -name tests -prune -exec rm -rf {} + \
    && (find . -path ./nvidia -prune -o -type f \( -name '*.so' -o -name '*.so.*' \) \
        -exec strip --strip-debug {} + || true) \
    && if [ -d nvidia ]; then ls -d "$PWD"/nvidia/*/lib >/etc/ld.so.conf.d/nvidia-wheels.conf \
        && ldconfig; fi \
    && apt-get purge -y --auto-remove g++ python3.11-dev binutils \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/* /var/log/apt /var/log/dpkg.log \
    && find /opt/venv -type d -name __pycache__ -prune -exec rm -rf {} + \
    && TF_CPP_MIN_LOG_LEVEL=3 python -W ignore -c "import tensorflow, tf_keras, tfx.v1, \
tfx.components, tfx.orchestration.kubeflow.v2.kubeflow_v2_dag_runner, apache_beam, \
tensorflow_transform.beam, tensorflow_data_validation, tensorflow_model_analysis, \
pyarrow.parquet, pyspark.sql, numba, sklearn, matplotlib.pyplot, kfp, \
google.cloud.aiplatform, PIL.Image, isal.igzip, psutil, yaml, click" 2>/dev/null

# The project itself, last: a code change rebuilds from here (35 s on 2 cores, bench/RESULTS.md;
# most of it podman checking the cached venv layer). Installed editable so
# that it runs from /pipeline, beside its schemas/ (pipeline/configs.py's CONTAINER_WORKDIR).
# PEP 660 (--use-pep517): setuptools' legacy `develop` writes a `tfrp` script that declares
# __requires__, and pkg_resources then checks every requirement's requirement at import,
# failing on tensorflow-cpu and the packages left out above.
WORKDIR /pipeline
COPY constraints.txt setup.py README.md ./
COPY components ./components
COPY tfrecord_shards ./tfrecord_shards
COPY shard_readers ./shard_readers
COPY spark_shards ./spark_shards
COPY local_cluster ./local_cluster
COPY pipeline ./pipeline
COPY schemas ./schemas
RUN pip install --no-deps --no-build-isolation --no-index --use-pep517 -e . \
    && python -m compileall -q components pipeline tfrecord_shards shard_readers spark_shards local_cluster
# Every compiled loop (encoder, framing, split hash, statistics) into numba's cache in the
# image, beside the modules (pipeline/jit_cache.py): a container on the same kind of CPU
# loads them instead of compiling them in every task that writes examples or statistics
# (about 10 s in ExampleGen, 15 s in StatisticsGen).
RUN python -m pipeline.jit_cache

# No ENTRYPOINT: Kubeflow and Vertex run each task's own command (`python -m ...`).
# `podman run IMAGE tfrp run` runs the local pipeline.
CMD ["tfrp", "--help"]
