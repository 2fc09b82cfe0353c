"""What a label asks of the model: binary, multiclass or regression. No TensorFlow here, so
the pipeline can settle the task (and the Evaluator's metrics) before anything trains.

The rules, from the label's values or its schema:
- a float label is regression, unless every value is integral (0.0, 1.0, 2.0: a class id
  stored as a float, as R and pandas often write one), when it follows the int rules, as
  scikit-learn's `type_of_target` does;
- an int label whose values are all 0 or 1 is binary; one whose values look like class ids
  (0..K-1: at least 3 values, the smallest 0, all below MAX_CLASS_IDS, and at least half of
  the ids up to the largest seen) is multiclass; any other int label (a price, a count, a
  year, ratings from 1) is regression. For multiclass ints Transform records the largest id
  over all the training rows in the schema, so the number of classes is never a sample's;
- a string label with two values is binary, with more it is multiclass (Transform maps the
  strings to ids through a vocabulary, whose size is the number of classes).
`LabelSummary.reason` says in words which rule chose the task (the run summary shows it).
The `task` setting overrides them.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from tensorflow_metadata.proto.v0 import schema_pb2

AUTO = "auto"
BINARY = "binary"
MULTICLASS = "multiclass"
REGRESSION = "regression"
TASKS = (BINARY, MULTICLASS, REGRESSION)

# The serving signature's outputs. Binary: the positive class's probability. Multiclass: every
# class's probability, the top class's id and its name (the label's value: a vocabulary
# string, or the int). Regression: the predicted value.
PROBABILITY = "probability"
PROBABILITIES = "probabilities"
CLASS_IDS = "class_ids"
CLASSES = "classes"
PREDICTION = "prediction"


# An int label with values at or above this is a quantity, not a class id.
MAX_CLASS_IDS = 64


class TaskError(ValueError):
    """A label the task cannot be settled from; the message says which setting fixes it."""


@dataclasses.dataclass(frozen=True)
class LabelSummary:
    """What a sample of the label says: its task, and the numbers the Evaluator's default
    bounds come from (regression: the MSE of predicting the sample's mean)."""

    task: str
    rows: int
    distinct: Optional[int] = None
    mean: Optional[float] = None
    variance: Optional[float] = None
    reason: str = ""


def check_task(task: Optional[str]) -> None:
    if task not in (None, AUTO) + TASKS:
        raise ValueError(f"task must be one of {(AUTO,) + TASKS}, not {task!r}")


def summarize_label(values, label_key: str, source: str) -> LabelSummary:
    """The task of a label from a pyarrow array of its values (CSV text included: text that
    parses as numbers is numbers)."""
    # pyarrow (with numpy): 0.14-0.20 s to import; pipeline/configs imports this module for
    # every tfrp command, --help included.
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_list(values.type) or pa.types.is_large_list(values.type):
        values = pc.list_flatten(values)
    values = values.drop_null()
    if not len(values):
        raise TaskError(f"{source}: the label {label_key!r} has no values in the rows sampled; "
                        f"set label_key to a column of the data, or set task="
                        f"binary|multiclass|regression when preprocessing_fn computes it")
    if pa.types.is_binary(values.type) or pa.types.is_string(values.type) or \
            pa.types.is_large_binary(values.type):
        values = _as_numbers(values)
    if pa.types.is_boolean(values.type):
        values = values.cast(pa.int64())
    if pa.types.is_floating(values.type) and _integral(values):
        values, stored = values.cast(pa.int64()), "integral floats"
    else:
        stored = "integers"
    if pa.types.is_integer(values.type):
        distinct = sorted(pc.unique(values).to_pylist())
        if set(distinct) <= {0, 1}:
            return LabelSummary(BINARY, len(values), len(distinct), reason=(
                f"label has {len(distinct)} value{'s' if len(distinct) > 1 else ''}, "
                f"{' and '.join(map(str, distinct))}" + _stored(stored)))
        if _class_ids(distinct):
            return LabelSummary(MULTICLASS, len(values), len(distinct), reason=(
                f"label has {len(distinct)} class ids from 0 to {distinct[-1]}"
                + _stored(stored)))
        return _regression(values, len(distinct), (
            f"label holds {stored}, {len(distinct)} values from {distinct[0]} to {distinct[-1]}, "
            f"not class ids 0..K-1 below {MAX_CLASS_IDS}"))
    if pa.types.is_floating(values.type) or pa.types.is_decimal(values.type):
        return _regression(values, None, "label has fractional numbers")
    distinct = len(pc.unique(values))
    if distinct < 2:
        raise TaskError(f"{source}: the label {label_key!r} holds one value in the rows "
                        f"sampled; a model cannot learn from it")
    return LabelSummary(BINARY if distinct == 2 else MULTICLASS, len(values), distinct,
                        reason=f"label has {distinct} text values")


def _regression(values, distinct: Optional[int], reason: str) -> LabelSummary:
    # pyarrow (with numpy): 0.14-0.20 s to import; pipeline/configs imports this module for
    # every tfrp command, --help included.
    import pyarrow as pa

    numbers = values.cast(pa.float64()).to_numpy(zero_copy_only=False)
    return LabelSummary(REGRESSION, len(values), distinct, float(numbers.mean()),
                        float(numbers.var()), reason)


def _integral(values) -> bool:
    """Every value a whole number small enough to be an int64 exactly (NaN and inf are not)."""
    # numpy: 0.2 s to import; see pyarrow above.
    import numpy as np

    numbers = values.to_numpy(zero_copy_only=False)
    return bool(np.all(np.isfinite(numbers)) and np.all(numbers == np.round(numbers))
                and np.all(np.abs(numbers) < 2 ** 53))


def _stored(stored: str) -> str:
    return ", stored as floats" if stored == "integral floats" else ""


def _class_ids(distinct: list[int]) -> bool:
    return len(distinct) >= 3 and min(distinct) == 0 and max(distinct) < MAX_CLASS_IDS and \
        len(distinct) * 2 >= max(distinct) + 1


def _as_numbers(values):
    """Text that is all ints becomes int64, all numbers float64; anything else stays text."""
    # pyarrow (with numpy): 0.14-0.20 s to import; pipeline/configs imports this module for
    # every tfrp command, --help included.
    import pyarrow as pa

    for number_type in (pa.int64(), pa.float64()):
        try:
            return values.cast(pa.string()).cast(number_type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            continue
    return values


def task_from_schema(label: Optional[schema_pb2.Feature]) -> Optional[str]:
    """The task a (transformed) label's schema implies, or None when it does not say: a float
    is regression, an int with a categorical domain (a vocabulary) is binary for two ids and
    multiclass for more."""
    if label is not None and label.type == schema_pb2.FLOAT:
        return REGRESSION
    classes = classes_from_schema(label)
    if classes:
        return BINARY if classes == 2 else MULTICLASS
    return None


def classes_from_schema(label: Optional[schema_pb2.Feature]) -> Optional[int]:
    """Classes of an int label whose domain gives its range (Transform's vocabulary ids)."""
    if label is not None and label.type == schema_pb2.INT and label.HasField("int_domain") \
            and label.int_domain.max > 0:
        return int(label.int_domain.max) + 1
    return None
