"""Run code right after a module has executed, without importing it: how activation waits for
`cutlass`, and the virtual GPU for `torch` and the CUDA driver bindings."""

from __future__ import annotations

import importlib.util
import sys
import threading

__all__ = ["after_import"]

_lock = threading.RLock()


def after_import(name: str, callback) -> None:
    """Run `callback()` right after module `name` has executed (now, if it already has)."""
    with _lock:
        if name not in sys.modules:
            finder = next((f for f in sys.meta_path if isinstance(f, _AfterImport)), None)
            if finder is None:
                finder = _AfterImport()
                sys.meta_path.insert(0, finder)
            finder.waiting.setdefault(name, []).append(callback)
            return
    callback()


class _AfterImport:
    """A meta path finder that lets the other finders find each waited-for module, then runs
    its callbacks right after the module has executed. It stays in place until then: a library
    probing with importlib.util.find_spec("cutlass") finds a spec it never loads."""

    def __init__(self):
        self.waiting: dict[str, list] = {}  # module name -> callbacks
        self._finding = threading.local()

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.waiting or getattr(self._finding, "now", False):
            return None
        self._finding.now = True  # the other finders are asked below, not this one again
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._finding.now = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _ThenCall(spec.loader, lambda: self._loaded(fullname))
        return spec

    def _loaded(self, name: str) -> None:
        with _lock:
            callbacks = self.waiting.pop(name, [])
            if not self.waiting and self in sys.meta_path:
                sys.meta_path.remove(self)
        for callback in callbacks:
            callback()

    def invalidate_caches(self) -> None:
        pass


class _ThenCall:
    """A loader that executes the module with the real loader, puts that loader back in the
    module's attributes, then calls back."""

    def __init__(self, loader, callback):
        self._loader = loader
        self._callback = callback

    def __getattr__(self, name):
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        module.__loader__ = self._loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self._loader
        self._callback()
