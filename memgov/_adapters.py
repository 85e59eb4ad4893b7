"""Framework adapters: plugins found through the ``memgov.adapters`` entry-point group.

An adapter module must not import its framework at module level: loading adapters is cheap and
never initialises CUDA. Each adapter gets a :class:`Budget` twice: ``configure_env`` before its
framework is imported (environment only), and ``apply`` once the framework is imported (right
away if it already is, else from an import hook), before the framework touches the GPU.
"""

from __future__ import annotations

import logging
import sys
import threading
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Protocol, runtime_checkable

from memgov import _importhook

GROUP = "memgov.adapters"
log = logging.getLogger("memgov")


@dataclass(frozen=True)
class Budget:
    """What a claim asks of the frameworks in this process."""

    bytes: int | None
    """Whole-process device memory (NVML's view, CUDA context included); None = growth only."""
    device_uuid: str
    device_total: int
    device_index: int | None
    """The device's index in this process's frameworks (cuda:N); None for simulated devices."""
    simulated: bool
    name: str
    threads: int | None = None
    """CPU threads this process may use now (memgov/_threads.py decides, before govern());
    None = leave the thread pools as they are."""
    hard: bool = False
    """True when the GPU driver also enforces ``bytes`` (MPS pinned limit)."""


@runtime_checkable
class Adapter(Protocol):
    name: str
    module: str
    """Top-level module whose import triggers ``apply`` (e.g. "torch")."""

    def configure_env(self, budget: Budget) -> str | None:
        """Set environment variables the framework reads at import or start-up. No imports."""

    def apply(self, budget: Budget) -> str:
        """Make the imported framework respect the budget; return a one-line report."""

    def cuda_initialized(self) -> bool:
        """Whether the framework (already imported) has initialised CUDA in this process."""


_lock = threading.Lock()
_loaded: list[Adapter] | None = None
_failures: list[str] = []


def available() -> list[Adapter]:
    """Every installed adapter (loaded once; a broken plugin is logged and skipped)."""
    global _loaded
    with _lock:
        if _loaded is None:
            found: list[Adapter] = []
            for point in entry_points(group=GROUP):
                try:
                    adapter = point.load()()
                except Exception as exc:  # a broken plugin must not break the claim
                    _failures.append(f"adapter {point.name!r} failed to load: {exc}")
                    log.warning("memgov: %s", _failures[-1])
                    continue
                found.append(adapter)
            _loaded = found
        return list(_loaded)


def load_failures() -> list[str]:
    available()
    return list(_failures)


def cuda_initialized() -> bool:
    """Whether any imported framework has already initialised CUDA in this process."""
    return any(a.module in sys.modules and a.cuda_initialized() for a in available())


def govern(budget: Budget, reports: dict[str, str]) -> None:
    """Apply ``budget`` through every adapter, now or when its framework is imported.

    ``reports`` receives one line per adapter as it takes effect (a claim shows it).
    """
    for adapter in available():
        note = adapter.configure_env(budget)
        if note:
            reports[adapter.name] = note

        def apply(_module: object, adapter: Adapter = adapter) -> None:
            try:
                reports[adapter.name] = adapter.apply(budget)
            except Exception as exc:
                reports[adapter.name] = f"FAILED: {type(exc).__name__}: {exc}"
                log.warning("memgov: %s adapter could not apply the budget: %s", adapter.name, exc)

        _importhook.when_imported(adapter.module, apply)
