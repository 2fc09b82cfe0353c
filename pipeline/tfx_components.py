"""TFX's `tfx.components` package, imported without running its `__init__` until one of the
names it re-exports is asked for. Each process entry point (`tfrp`, the compiled pipeline's
task command) calls `defer_package_init` before it imports TFX; nothing else calls this module.

That `__init__` imports all 16 stock components, and with them TensorFlow Model Analysis,
KerasTuner, Kubernetes' client and BulkInferrer's Beam jobs; TFX's own modules import it
on the way to a constant (`tfx.components.evaluator.constants` from ML Metadata's input
resolution and from the Kubeflow v2 entrypoint). A component's own module
(`tfx.components.pusher.component`, ...) is a submodule and imports as usual, so a process
imports only the components it uses. A component class the package re-exports
(`tfx.components.FileBasedExampleGen`, which TFX's Kubeflow v2 compiler asks for about every
task) imports only the module the `__init__` takes it from: `tfrp compile` no longer imports
KerasTuner, BulkInferrer and the rest (9.06 to 7.84 CPU-s, bench/RESULTS.md). Any other
name the package sets (`__all__`) runs the real `__init__` first and then behaves as it always
has.
"""
from __future__ import annotations

import ast
import importlib
import sys

from pipeline import module_loading

PACKAGE = "tfx.components"


class _DeferredInit(module_loading.LoadHook):
    """Loads `tfx.components` with its `__init__` put off until a name the package sets is
    asked for. Nothing is imported before something imports the package (`tfrp examplegen`
    imports no TFX at all)."""

    NAME = PACKAGE

    def run_module(self, module, init) -> None:
        sources = _imported_from(init.get_source(PACKAGE) or "")

        def __getattr__(name: str):
            if name in sources:  # a component class: its own module, not all 16
                value = getattr(importlib.import_module(sources[name]), name)
                setattr(module, name, value)
                return value
            # Any other name the package sets (`__all__`): run its __init__ now.
            del module.__dict__["__getattr__"]
            init.exec_module(module)
            return getattr(module, name)

        module.__getattr__ = __getattr__


def _imported_from(init_source: str) -> dict[str, str]:
    """Each name the `__init__` imports with `from MODULE import NAME`, and its module."""
    return {alias.asname or alias.name: statement.module
            for statement in ast.parse(init_source).body
            if isinstance(statement, ast.ImportFrom) and statement.module and not statement.level
            for alias in statement.names}


def defer_package_init() -> None:
    """Has `tfx.components` imported with its `__init__` not yet run (a no-op once the
    package is imported, or once this has been called)."""
    if PACKAGE not in sys.modules:
        module_loading.install(_DeferredInit)
