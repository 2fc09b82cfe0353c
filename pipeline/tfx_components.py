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

import importlib.util
import sys

PACKAGE = "tfx.components"


def defer_package_init() -> None:
    """Puts `tfx.components` in `sys.modules` with its `__init__` not yet run (a no-op once
    the package is imported)."""
    if PACKAGE in sys.modules:
        return
    import tfx

    spec = importlib.util.find_spec(PACKAGE)
    package = importlib.util.module_from_spec(spec)

    def __getattr__(name: str):
        # A name the package sets (a component class, `__all__`): run its __init__ now.
        del package.__dict__["__getattr__"]
        spec.loader.exec_module(package)
        return getattr(package, name)

    package.__getattr__ = __getattr__
    sys.modules[PACKAGE] = package
    tfx.components = package
