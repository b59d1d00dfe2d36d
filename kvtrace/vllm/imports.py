"""Run a callback when a module is imported (or now, if it already is).

The plugin uses this so that a vLLM process patches only what it actually loads: the API
server imports the OpenAI serving modules, the engine core imports NIXL, and neither pays for
the other.  One ``sys.meta_path`` finder serves every hook; it wraps the real loader's
``exec_module`` for the named modules only and never changes how any module is found.
"""

from __future__ import annotations

import importlib.abc
import logging
import sys
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)
_lock = threading.Lock()


def _run(callbacks, module) -> None:
    for cb in callbacks:
        try:
            cb(module)
        except Exception:  # a patch that fails leaves vLLM as it was
            log.exception("kvtrace: post-import hook for %s failed", module.__name__)


class _Loader(importlib.abc.Loader):
    def __init__(self, loader, callbacks):
        self._loader = loader
        self._callbacks = callbacks

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        _run(self._callbacks, module)

    def __getattr__(self, name):  # get_code, get_source, is_package, ...
        return getattr(self._loader, name)


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self):
        self.hooks: dict[str, list[Callable]] = {}

    def find_spec(self, fullname, path, target=None):
        if fullname not in self.hooks:
            return None
        with _lock:
            callbacks = self.hooks.pop(fullname, None)
        if not callbacks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader, callbacks)
                return spec
        return None


_finder = _Finder()


def when_imported(name: str, callback: Callable) -> None:
    """Call ``callback(module)`` once ``name`` is imported (immediately if it already is)."""
    module = sys.modules.get(name)
    if module is not None:
        _run([callback], module)
        return
    with _lock:
        _finder.hooks.setdefault(name, []).append(callback)
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)
