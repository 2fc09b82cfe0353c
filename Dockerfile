# The image Kubeflow Pipelines and Vertex AI run. Its base tag must equal the tfx pin in
# constraints.txt (a test checks this).
FROM gcr.io/tfx-oss-public/tfx:1.16.0

ENV TF_USE_LEGACY_KERAS=1 \
    PYTHONUNBUFFERED=1

WORKDIR /pipeline
COPY constraints.txt setup.py README.md ./
COPY components ./components
COPY pipeline ./pipeline
COPY schemas ./schemas
COPY bench ./bench
RUN pip install --no-cache-dir --ignore-requires-python -c constraints.txt -e .
