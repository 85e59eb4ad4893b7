"""Run code right before a module's code runs, or right after it, before the importer gets it back.

Adapters need the second: TensorFlow's GPU options and JAX's allocator settings only take effect
if applied after the framework is imported but before its first operation. Auto-enable needs the
first: the thread variables (OMP_NUM_THREADS, OPENBLAS_NUM_THREADS, ...) are read once, when the
libraries a framework's import loads start their thread pools (numpy's OpenBLAS starts one thread
per core at load, each spinning for a while: docs/threads.md).

Which modules those are is the adapters' registry: :func:`frameworks`, the names in the
entry-point group :data:`GROUP`, one per framework adapter (docs/adapters.md).
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import importlib.util
import os
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

Callback = Callable[[ModuleType], None]

GROUP = "memgov.adapters"
"""The entry-point group of the framework adapters (memgov.adapter re-exports it). An entry
point's name is the top-level module of the framework its adapter governs."""

_lock = threading.RLock()
_callbacks: dict[str, list[Callback]] = {}
_before: dict[str, list[tuple[Callback, Callback | None]]] = {}
"""Callbacks to run before a module's code (the module object exists, its code has not run),
each with the one to run if that code then raises."""
_resolving: set[str] = set()
_executing: set[str] = set()
"""Modules whose code is running under our loader: in sys.modules, but not imported yet."""


def _fresh_lock_in_child() -> None:
    # A lock held at fork() time (by an import in another thread: every import asks this
    # finder) stays held in the forked child, where that thread does not exist: the child's
    # next import would wait forever.
    global _lock
    _lock = threading.RLock()


os.register_at_fork(after_in_child=_fresh_lock_in_child)


def frameworks() -> tuple[str, ...]:
    """The frameworks memgov governs: the names in :data:`GROUP` of the distributions on
    sys.path. Read from their ``entry_points.txt`` files directly (0.73 ms with 86 distributions
    installed) and not through importlib.metadata, whose import alone costs 15 ms
    (results/cpu-2core/2026-12-07-adapter-registry.txt): auto-enable asks at every governed
    interpreter's start."""
    names: set[str] = set()
    for folder in sys.path:
        try:
            entries = [
                e for e in os.listdir(folder or ".") if e.endswith((".dist-info", ".egg-info"))
            ]
        except OSError:  # a zip file, a folder gone: no adapter registered there
            continue
        for entry in entries:
            try:
                with open(os.path.join(folder or ".", entry, "entry_points.txt"), "rb") as file:
                    lines = file.read().decode().splitlines()
            except (OSError, UnicodeDecodeError):
                continue
            inside = False
            for line in map(str.strip, lines):  # INI: [group] then "name = module:attr" lines
                if line.startswith("["):
                    inside = line == f"[{GROUP}]"
                elif inside and "=" in line and not line.startswith(("#", ";")):
                    names.add(line.partition("=")[0].strip())
    return tuple(sorted(names))


def when_imported(name: str, callback: Callback) -> None:
    """Call ``callback(module)`` once ``name`` is imported (now, if it already is)."""
    with _lock:
        module = sys.modules.get(name)
        if module is None or name in _executing:
            # Mid-import (e.g. tensorflow imports jax, whose hook claims and then reaches
            # tensorflow's adapter): wait for the end of its import, as for one not yet started.
            _callbacks.setdefault(name, []).append(callback)
            _install()
            return
    callback(module)


def when_importing(name: str, callback: Callback, failed: Callback | None = None) -> None:
    """Call ``callback(module)`` right before ``name``'s code runs, when it is first imported:
    the module is in sys.modules, empty, and counts as being imported (:func:`imported` is
    False; a :func:`when_imported` callback registered then runs when its import ends). Where
    ``name`` is imported or being imported already, it is too late for that: the callback
    runs as :func:`when_imported` would run it. An exception from the callback fails the
    import (importlib then removes the empty module). ``failed(module)``, if given, runs when
    that import raises, in its code or in a :func:`when_imported` callback at its end (the
    exception then goes on to the importer); an exception from it is not raised, the import's
    own is."""
    with _lock:
        if name not in sys.modules:
            _before.setdefault(name, []).append((callback, failed))
            _install()
            return
    when_imported(name, callback)


def imported(name: str) -> bool:
    """Whether ``name`` is imported: in sys.modules, and its code is not still running (a
    module mid-import is in sys.modules too, without most of its attributes)."""
    with _lock:
        return name in sys.modules and name not in _executing


def _install() -> None:
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


def _fire(name: str, module: ModuleType) -> None:
    with _lock:
        pending = _callbacks.pop(name, [])
    for callback in pending:
        callback(module)


class _Finder:  # duck-typed: importlib.abc imports importlib.resources, slow at start-up
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        with _lock:
            wanted = fullname in _callbacks or fullname in _before
            if not wanted or fullname in _resolving:
                return None
            _resolving.add(fullname)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            with _lock:
                _resolving.discard(fullname)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _Loader(spec.loader, fullname)  # type: ignore[assignment]  # duck-typed
        return spec


class _Loader:
    def __init__(self, inner: Any, name: str) -> None:
        self._inner = inner
        self._name = name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        result: ModuleType | None = self._inner.create_module(spec)
        return result

    def exec_module(self, module: ModuleType) -> None:
        # Restore the real loader first: frameworks look at __loader__/__spec__ (e.g. resources).
        module.__loader__ = self._inner
        if module.__spec__ is not None:
            module.__spec__.loader = self._inner
        with _lock:
            _executing.add(self._name)
            before = _before.pop(self._name, [])
        try:
            try:
                for callback, _failed in before:
                    callback(module)
                self._inner.exec_module(module)
            finally:
                with _lock:
                    _executing.discard(self._name)
            _fire(self._name, module)
        except BaseException:
            # The framework's code raised, or a callback did (or an interrupt landed between
            # them): the "before" callbacks' partners undo what those set up.
            for _callback, failed in before:
                if failed is not None:
                    with contextlib.suppress(Exception):  # the import's own error is the one
                        failed(module)
            raise

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._inner, attr)
