"""`python -m bench accuracy`: does training on packed records cost accuracy?

The full taxi sample goes through our ExampleGen once, then through ShardedTransform twice with
the pipeline's taxi preprocessing_fn: packed 1,024 rows per Example, and one row per Example.
The pipeline's `run_fn` trains the same model on each, with the same steps, batch size and
seed; both models then score the same raw eval Examples through their serving signatures,
labelled by their own `transform_features` signature (the label Transform derives).
Repeated over several seeds; medians reported.
"""
from __future__ import annotations

import os
import statistics
from typing import Callable

from bench.display import Table

VARIANTS = {"packed": 1024, "per-row": 0}
SCORE_BATCH = 1024


def _examples(work_dir: str, log: Callable[[str], None]) -> str:
    from tfrecord_shards import shards
    from components.example_gen import beam_job
    from components.example_gen.options import ExampleGenOptions
    from components.example_gen.sources.locate import TAXI_SOURCE

    out = os.path.join(work_dir, "examples")
    if shards.read_manifest(out) is None:
        log("ExampleGen: the full taxi sample")
        beam_job.run(ExampleGenOptions(source=TAXI_SOURCE), out)
    return out


def _transformed(examples: str, work_dir: str, name: str, packed_rows: int,
                 log: Callable[[str], None]) -> str:
    from components.transform import taxi
    from tfrecord_shards import shards
    from tfrecord_shards.codec import schema_file
    from components.transform import beam_job
    from components.transform.options import TransformOptions

    out = os.path.join(work_dir, f"transformed-{name}")
    if shards.read_manifest(os.path.join(out, "examples")) is None:
        log(f"Transform: {name}")
        beam_job.run(TransformOptions(preprocessing_fn=taxi.PREPROCESSING_FN,
                                      packed_rows=packed_rows),
                     examples, schema_file.load_schema(examples), os.path.join(out, "graph"),
                     os.path.join(out, "examples"))
    return out


def _train(transformed: str, model_dir: str, steps: int, seed: int) -> None:
    from tfx.components.trainer.fn_args_utils import FnArgs

    from components.transform import taxi
    from components.trainer import module

    data = os.path.join(transformed, "examples")
    module.run_fn(FnArgs(
        train_files=[os.path.join(data, "Split-train", "*")],
        eval_files=[os.path.join(data, "Split-eval", "*")],
        train_steps=steps, eval_steps=0,
        # The transformed examples' own schema, which says whether they are packed.
        schema_path=os.path.join(data, "schema.pbtxt"),
        transform_graph_path=os.path.join(transformed, "graph"),
        serving_model_dir=os.path.join(model_dir, "serving"),
        model_run_dir=os.path.join(model_dir, "run"),
        custom_config={**taxi.TRAINER_SETTINGS, "seed": seed, "batch_size": 256}))


def _score(model_dir: str, eval_records: list[bytes]) -> dict:
    """Accuracy and AUC of a saved model on raw serialized Examples."""
    import numpy as np
    import tensorflow as tf
    from sklearn.metrics import roc_auc_score

    from components.transform.taxi import TAXI_LABEL
    from components.trainer.options import TRANSFORM_SIGNATURE

    model = tf.saved_model.load(os.path.join(model_dir, "serving"))
    scores, labels = [], []
    for start in range(0, len(eval_records), SCORE_BATCH):
        batch = tf.constant(eval_records[start:start + SCORE_BATCH])
        scores.append(model.signatures["serving_default"](examples=batch)["probability"]
                      .numpy().ravel())
        labels.append(model.signatures[TRANSFORM_SIGNATURE](examples=batch)[TAXI_LABEL]
                      .numpy().ravel())
    score, label = np.concatenate(scores), np.concatenate(labels)
    return {"accuracy": float(((score > 0.5) == (label > 0.5)).mean()),
            "auc": float(roc_auc_score(label, score)), "examples": int(len(label))}


def run_benchmark(work_dir: str, seeds: int, steps: int,
                  log: Callable[[str], None] = print) -> dict:
    import glob

    import tensorflow as tf

    examples = _examples(work_dir, log)
    eval_records = [r.numpy() for r in tf.data.TFRecordDataset(
        sorted(glob.glob(os.path.join(examples, "Split-eval", "*"))), compression_type="GZIP")]
    transformed = {name: _transformed(examples, work_dir, name, rows, log)
                   for name, rows in VARIANTS.items()}
    runs: dict[str, list[dict]] = {name: [] for name in VARIANTS}
    for seed in range(seeds):
        for name in VARIANTS:
            model_dir = os.path.join(work_dir, "models", f"{name}-seed{seed}")
            if tf.io.gfile.exists(model_dir):
                tf.io.gfile.rmtree(model_dir)
            _train(transformed[name], model_dir, steps, seed)
            runs[name].append(dict(_score(model_dir, eval_records), seed=seed))
            log(f"seed {seed} {name:>8}: accuracy {runs[name][-1]['accuracy']:.4f}  "
                f"AUC {runs[name][-1]['auc']:.4f}")
    result = {"steps": steps, "seeds": seeds, "eval_examples": len(eval_records), "runs": runs,
              "median": {name: {metric: statistics.median(r[metric] for r in runs[name])
                                for metric in ("accuracy", "auc")} for name in VARIANTS}}
    gaps = [p["accuracy"] - r["accuracy"] for p, r in zip(runs["packed"], runs["per-row"])]
    result["accuracy_gap_points"] = {"median": 100 * statistics.median(gaps),
                                     "per_seed": [100 * g for g in gaps]}
    return result


def table(result: dict) -> Table:
    return Table(result["median"], [("accuracy", "accuracy", "{:.4f}"), ("AUC", "auc", "{:.4f}")],
                 f"packed - per-row accuracy: {result['accuracy_gap_points']['median']:+.2f} "
                 f"points (median over {result['seeds']} seeds)")
