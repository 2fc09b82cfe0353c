"""Datasets that ship inside installed packages, found at run time rather than copied in."""
from __future__ import annotations

import os

TAXI = "taxi"


def taxi_csv_path() -> str:
    """The Chicago taxi sample (15,002 trips) bundled in the tfx wheel."""
    import tfx

    path = os.path.join(
        os.path.dirname(tfx.__file__),
        "examples", "chicago_taxi_pipeline", "data", "simple", "data.csv",
    )
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"The taxi sample is missing from the installed tfx package: {path}"
        )
    return path
