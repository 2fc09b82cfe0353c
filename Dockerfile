# The image Kubeflow Pipelines and Vertex AI run (`make image`; docs: README, "The image").
#
# The base is Debian 12 (bookworm), whose python3 is 3.11: the Python constraints.txt is
# pinned for (glibc 2.36, cp311 wheels). TFX's own image (gcr.io/tfx-oss-public/tfx:1.16.0)
# is Python 3.10, which six of our pins have no wheel for, and sets an ENTRYPOINT. Any
# bookworm image with apt works as BASE_IMAGE; scripts/build-image.sh makes one with mmdebstrap
# when the default cannot be pulled. Both stages must use the same base: the venv's python is
# a link to the base's /usr/bin/python3.11.
ARG BASE_IMAGE=docker.io/library/debian:bookworm-slim

# ---- builder: compilers, wheels built and installed into /opt/venv -------------------------
FROM ${BASE_IMAGE} AS builder
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        build-essential ca-certificates python3.11 python3.11-dev python3.11-venv \
    && rm -rf /var/lib/apt/lists/*
RUN python3.11 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# Where pip finds packages: PyPI unless these are given (scripts/build-image.sh passes the
# building machine's own pip settings, with their local folders mounted read-only).
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_FIND_LINKS
# Dependencies only (setup.py's install_requires under constraints.txt), before any source:
# a code change reuses this layer.
COPY constraints.txt setup.py scripts/install_requires.py /tmp/deps/
RUN cd /tmp/deps \
    && python install_requires.py setup.py > requirements.txt \
    && pip install --ignore-requires-python -c constraints.txt -r requirements.txt \
    && rm -rf /tmp/deps

# ---- the image: no compiler -----------------------------------------------------------------
FROM ${BASE_IMAGE}
# Java for ExampleGen's Spark engine (pyspark runs its JVM in the container); Spark 3.5
# supports Java 8, 11 and 17. The man folder must exist for the JRE's update-alternatives.
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && apt-get install -y --no-install-recommends \
        ca-certificates python3.11 openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/*
COPY --from=builder /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    VIRTUAL_ENV=/opt/venv \
    TF_USE_LEGACY_KERAS=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# The project itself, last: a code change rebuilds from here (seconds). Installed editable so
# that it runs from /pipeline, beside its schemas/ (pipeline/configs.py's CONTAINER_WORKDIR).
WORKDIR /pipeline
COPY constraints.txt setup.py README.md ./
COPY components ./components
COPY pipeline ./pipeline
COPY schemas ./schemas
COPY bench ./bench
RUN pip install --no-deps --no-build-isolation --no-index -e . \
    && python -m compileall -q components pipeline bench
# Compile the encoder's and the framing's loops into the image (numba caches the machine code
# beside components/codec/wire.py), so a container on the same kind of CPU loads them instead
# of compiling them (about 6 s) in every step that writes examples.
RUN python -c "import pyarrow as pa; \
from components import tfrecord_io; from components.codec import serializer; \
batch = pa.RecordBatch.from_pydict({'i': [1, None], 'f': [1.5, 2.0], 's': ['a', None]}); \
kinds = {'i': ('int', False), 'f': ('float', False), 's': ('bytes', False)}; \
tfrecord_io.frame_records(serializer.encode_examples_array(serializer.to_example_batch(batch, kinds)))"

# No ENTRYPOINT: Kubeflow and Vertex run each task's own command (`python -m ...`).
# `podman run IMAGE tfrp run` runs the local pipeline.
CMD ["tfrp", "--help"]
