"""google-api-core's Python version check without its scan of every installed package. Each
process entry point (`tfrp`, the compiled pipeline's task command) calls `skip_package_scan`
before it imports anything of Google's; nothing else calls this module.

Every Google Cloud client package (BigQuery's, Cloud Storage's, Vertex AI's, ...) calls
`google.api_core.check_python_version` as it is imported, and from google-api-core 2.28.0
that call starts with `importlib.metadata.packages_distributions()`, which reads the metadata
and file list of every installed distribution (about 290 in `.venv`) only to name the package
in a warning: at every call up to 2.30.2, once a process from 2.30.3. Beam imports BigQuery's
client, so every process that imports Beam or TFX scanned four times with the pinned 2.29.0:
`tfrp examplegen` on the taxi sample took 6.09 CPU-s with the scans and 4.06 without
(medians of 3, bench/RESULTS.md). google-api-core 2.44.0 made the lookup a no-op
(googleapis/python-api-core#878), but it needs protobuf 6.33.5 or newer, and TensorFlow 2.16
needs protobuf 4. This gives the pinned release the lookup 2.44.0 has: the check and its
warnings run as before, naming the module (`google.cloud.bigquery`) as 2.44.0 does, and no
package is scanned.
"""
from __future__ import annotations

import sys
from typing import Optional

from pipeline import module_loading

MODULE = "google.api_core._python_version_support"


def _no_package_name(module_name: str) -> Optional[str]:
    """google-api-core 2.44.0's `_get_pypi_package_name`: the warning names the module."""
    return None


def _replace_lookup(module) -> None:
    if hasattr(module, "_get_pypi_package_name"):  # absent before 2.28: nothing to replace
        module._get_pypi_package_name = _no_package_name


class _ReplaceOnLoad(module_loading.LoadHook):
    """Replaces the version check's lookup as soon as its module has run, before
    `google.api_core`'s `__init__` calls the check."""

    NAME = MODULE

    def run_module(self, module, loader) -> None:
        loader.exec_module(module)
        _replace_lookup(module)


def skip_package_scan() -> None:
    """Has google-api-core's version check name modules without scanning every installed
    package (a no-op once called)."""
    if MODULE in sys.modules:
        _replace_lookup(sys.modules[MODULE])
    else:
        module_loading.install(_ReplaceOnLoad)
