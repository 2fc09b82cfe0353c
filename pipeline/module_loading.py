"""One module's loading taken over, for the process entry points' import changes
(`tfx_components.py`, `google_version_check.py`): the module is found where Python would find
it, and the hook decides how it runs."""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys


class LoadHook(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Loads the module named `NAME` with `run_module(module, loader)` in place of
    `loader.exec_module(module)`, `loader` being the one Python found for it."""

    NAME: str

    def find_spec(self, fullname, path, target=None):
        if fullname != self.NAME:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None:
            return None
        self._found = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec):
        return None  # Python's own module object

    def exec_module(self, module) -> None:
        self.run_module(module, self._found)

    def run_module(self, module, loader: importlib.abc.Loader) -> None:
        raise NotImplementedError


def install(hook: type[LoadHook]) -> None:
    """Puts `hook` before Python's own finders (once)."""
    if not any(isinstance(finder, hook) for finder in sys.meta_path):
        sys.meta_path.insert(0, hook())
