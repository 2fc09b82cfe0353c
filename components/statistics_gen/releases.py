"""The TFDV and TFMA releases the fast paths were checked against.

The fast StatisticsGen rebuilds TFDV 1.16's protos (and reads StatsOptions' private
attributes); the fast Evaluator calls TFMA internals (`_metric_value`, `_default_threshold`,
`spec._features`, `eval_config_writer._serialize_eval_run`). Another release may change any
of them without notice, so on one the components run the stock path instead and say so.
"""
from __future__ import annotations

import importlib.metadata
import logging
from typing import Optional

# The pins of constraints.txt that the parity tests ran against (tests/test_version_check.py
# keeps the two in step).
TESTED = {
    "tensorflow-data-validation": "1.16.1",
    "tensorflow-model-analysis": "0.47.1",
}


def untested(package: str) -> Optional[str]:
    """None when the installed release of `package` is the tested one; else the one line
    that says which release is installed. (Read at each call: a process may upgrade.)"""
    try:
        installed = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        installed = "none"
    if installed == TESTED[package]:
        return None
    return f"{package} {installed} is installed, the fast path is tested with {TESTED[package]}"


def fast_path_tested(package: str, component: str) -> bool:
    """Whether `component`'s fast path may use `package`'s internals; when not, logs one
    warning naming the package, both releases and that the stock path runs."""
    reason = untested(package)
    if reason is None:
        return True
    logging.warning("%s: %s; running the stock %s instead", component, reason, component)
    return False
