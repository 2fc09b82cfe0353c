"""TFX's `tfx.components` package, imported without running its `__init__` until one of the
names it re-exports is asked for. Each process entry point (`tfrp`, the compiled pipeline's
task command) calls `defer_package_init` before it imports TFX; nothing else calls this module.

That `__init__` imports all 16 stock components, and with them TensorFlow Model Analysis,
KerasTuner, Kubernetes' client and BulkInferrer's Beam jobs; TFX's own modules import it
on the way to a constant (`tfx.components.evaluator.constants` from ML Metadata's input
resolution and from the Kubeflow v2 entrypoint). A component's own module
(`tfx.components.pusher.component`, ...) is a submodule and imports as usual, so a process
imports only the components it uses. `from tfx.components import Evaluator`, or any other
name the package sets, runs the real `__init__` first and then behaves as it always has.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys

PACKAGE = "tfx.components"


class _DeferredInit(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds `tfx.components` where Python would, and loads it with its `__init__` put off
    until a name the package sets is asked for. Nothing is imported before something
    imports the package (`tfrp examplegen` imports no TFX at all)."""

    def find_spec(self, fullname, path, target=None):
        if fullname != PACKAGE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None:
            return None
        self._init = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec):
        return None  # Python's own module object

    def exec_module(self, module) -> None:
        init = self._init

        def __getattr__(name: str):
            # A name the package sets (a component class, `__all__`): run its __init__ now.
            del module.__dict__["__getattr__"]
            init.exec_module(module)
            return getattr(module, name)

        module.__getattr__ = __getattr__


def defer_package_init() -> None:
    """Has `tfx.components` imported with its `__init__` not yet run (a no-op once the
    package is imported, or once this has been called)."""
    if PACKAGE in sys.modules or any(isinstance(f, _DeferredInit) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _DeferredInit())
