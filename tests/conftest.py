"""Shared fixtures: real files only, made from data that ships in installed packages."""
from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402

from pipeline import datasets  # noqa: E402


@pytest.fixture(scope="session")
def taxi_csv() -> str:
    return datasets.taxi_csv_path()


@pytest.fixture(scope="session")
def taxi_slice_dir(tmp_path_factory, taxi_csv) -> str:
    """The first 2,000 taxi trips in a folder of their own, as CsvExampleGen wants."""
    folder = tmp_path_factory.mktemp("taxi_slice")
    with open(taxi_csv, encoding="utf-8") as src, open(folder / "data.csv", "w") as dst:
        for i, line in enumerate(src):
            if i > 2000:
                break
            dst.write(line)
    return str(folder)
