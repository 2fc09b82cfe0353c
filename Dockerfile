# The image Kubeflow Pipelines and Vertex AI run. Its base tag must equal the tfx pin in
# constraints.txt (a test checks this).
FROM gcr.io/tfx-oss-public/tfx:1.16.0

ENV TF_USE_LEGACY_KERAS=1 \
    PYTHONUNBUFFERED=1

# Java for ExampleGen's Spark engine (pyspark runs its JVM in the container); Spark 3.5
# supports Java 8, 11 and 17.
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /pipeline
COPY constraints.txt setup.py README.md ./
COPY components ./components
COPY pipeline ./pipeline
COPY schemas ./schemas
COPY bench ./bench
RUN pip install --no-cache-dir --ignore-requires-python -c constraints.txt -e .
# Compile the encoder's and the framing's loops into the image (numba caches the machine code
# beside components/codec/wire.py), so a container on the same kind of CPU loads them instead
# of compiling them (about 6 s) in every step that writes examples.
RUN python -c "import pyarrow as pa; \
from components import tfrecord_io; from components.codec import serializer; \
batch = pa.RecordBatch.from_pydict({'i': [1, None], 'f': [1.5, 2.0], 's': ['a', None]}); \
kinds = {'i': ('int', False), 'f': ('float', False), 's': ('bytes', False)}; \
tfrecord_io.frame_records(serializer.encode_examples_array(serializer.to_example_batch(batch, kinds)))"
