"""The release check before the fast paths use TFDV's and TFMA's internals: the tested
releases are the pinned ones, and on another release StatisticsGen and the Evaluator run the
stock path and say so in one warning. Another release is faked by the version that
`importlib.metadata` reports in this process (test set-up: the components run unchanged)."""
from __future__ import annotations

import importlib.metadata
import logging
import os
import re

import pytest

from components.statistics_gen import releases
# scikit-learn's iris through our ExampleGen and a multiclass model (tests/test_evaluator.py).
from test_evaluator import iris_models  # noqa: F401

CONSTRAINTS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "constraints.txt")


def _fake_release(monkeypatch, package: str, release: str) -> None:
    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version",
                        lambda name: release if name == package else real(name))


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
            and "the stock" in r.getMessage()]


def test_the_tested_releases_are_the_pinned_and_installed_ones():
    with open(CONSTRAINTS, encoding="utf-8") as f:
        pins = dict(re.findall(r"^([a-z0-9-]+)==([^\s;#]+)", f.read(), re.MULTILINE))
    for package, release in releases.TESTED.items():
        assert pins[package] == release, package
        assert importlib.metadata.version(package) == release, package
        assert releases.untested(package) is None


def test_another_release_is_named_in_one_line(monkeypatch, caplog):
    _fake_release(monkeypatch, "tensorflow-model-analysis", "0.48.0")
    assert not releases.fast_path_tested("tensorflow-model-analysis", "Evaluator")
    assert releases.fast_path_tested("tensorflow-data-validation", "StatisticsGen")
    assert _warnings(caplog) == [
        "Evaluator: tensorflow-model-analysis 0.48.0 is installed, the fast path is tested "
        "with 0.47.1; running the stock Evaluator instead"]


@pytest.mark.slow
def test_statistics_gen_runs_stock_on_another_tfdv(taxi_examples, tmp_path, monkeypatch,
                                                   caplog):
    """On a faked TFDV 1.17.0 our executor runs stock's Beam job, says so in one line, and
    writes what stock's writes."""
    from test_statistics_gen import SPLITS, load, our_statistics, stock_statistics

    stock = stock_statistics(taxi_examples, str(tmp_path / "stock"))
    fast = our_statistics(taxi_examples, str(tmp_path / "fast"))
    assert not _warnings(caplog)
    _fake_release(monkeypatch, "tensorflow-data-validation", "1.17.0")
    fallback = our_statistics(taxi_examples, str(tmp_path / "fallback"))
    assert _warnings(caplog) == [
        "StatisticsGen: tensorflow-data-validation 1.17.0 is installed, the fast path is "
        "tested with 1.16.1; running the stock StatisticsGen instead"]

    def exact(uri, split):
        """What TFDV computes exactly (its quantiles and histograms are sketches, which two
        runs of it may round apart): each feature's path, type and common statistics."""
        return sorted((tuple(f.path.step), f.type, getattr(f, f.WhichOneof("stats"))
                       .common_stats.SerializeToString(deterministic=True))
                      for f in load(uri, split).datasets[0].features)

    for split in SPLITS:
        assert exact(fallback.uri, split) == exact(stock.uri, split)
        assert exact(fast.uri, split) == exact(stock.uri, split)  # the same rows


@pytest.mark.slow
def test_evaluator_runs_stock_on_another_tfma(iris_models, tmp_path, monkeypatch, caplog):
    """On a faked TFMA 0.48.0 the fast Evaluator runs stock's: a calibration plot, which the
    fast path refuses, is computed and written."""
    import tensorflow_model_analysis as tfma

    from components.evaluator import executor
    from components.evaluator.options import UnsupportedSetting
    from test_evaluator import model_specs, run_evaluator

    examples, model, _ = iris_models
    config = tfma.EvalConfig(model_specs=model_specs("target", False),
                             metrics_specs=[tfma.MetricsSpec(metrics=[
                                 tfma.MetricConfig(class_name="ExampleCount"),
                                 tfma.MetricConfig(class_name="MultiClassConfusionMatrixPlot")])])
    with pytest.raises(UnsupportedSetting, match="plots"):
        run_evaluator(executor.Executor, tmp_path / "fast", examples, config, model)
    _fake_release(monkeypatch, "tensorflow-model-analysis", "0.48.0")
    uri, _ = run_evaluator(executor.Executor, tmp_path / "fallback", examples, config, model)
    assert _warnings(caplog) == [
        "Evaluator: tensorflow-model-analysis 0.48.0 is installed, the fast path is tested "
        "with 0.47.1; running the stock Evaluator instead"]
    (plots,) = tfma.load_plots(uri)
    assert plots.plot_keys_and_values
    metrics = {item.key.name: item.value.double_value.value
               for sliced in tfma.load_metrics(uri) for item in sliced.metric_keys_and_values}
    assert metrics["example_count"] > 0

