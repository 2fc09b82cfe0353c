"""A TransformGraph's digest: what says that a transformed split and a model were made by the
same graph. Transform records it in its manifest; the Trainer records the digest of the graph
it embeds beside the model (assets.extra); the Evaluator scores Transform's split through the
model's layers after the graph only when the two agree (a cached Trainer's model and a new
Transform's rows do not pair). It imports no TensorFlow."""
from __future__ import annotations

import hashlib

from tfrecord_shards import fileio

# The graph's parts that decide what it outputs: the SavedModel, its variables and assets
# (vocabularies), and the transformed schema.
_PARTS = ("transform_fn", "transformed_metadata")


def graph_digest(graph_dir: str) -> str:
    """sha256 over every file of the graph's parts, by path within the graph and content."""
    digest = hashlib.sha256()
    for part in _PARTS:
        top = fileio.join(graph_dir, part).rstrip("/")
        if not fileio.isdir(top):
            continue
        files = sorted(fileio.join(root, name) for root, _, names in fileio.walk(top)
                       for name in names)
        for path in files:
            digest.update(f"\0{part}/{path[len(top):].lstrip('/')}\0".encode())
            digest.update(fileio.read_bytes(path))
    return digest.hexdigest()
