"""The core's side of the adapter contract: load the plugins, apply a budget through each.

The contract itself (:class:`~memgov.adapter.Budget`, the :class:`~memgov.adapter.Adapter`
protocol) is public, in :mod:`memgov.adapter`; adapters import nothing else from memgov. Plugins are
found through the entry-point group ``memgov.adapters`` and loaded once per process, with this
module. :func:`facts` is the one table of framework facts that pack and doctor read (auto-enable
reads only the names, memgov._base.importhook.frameworks()).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from importlib.metadata import entry_points
from typing import Any

from memgov._base import importhook as _importhook, note_env_set, settings as _settings
from memgov.adapter import GROUP, Adapter, Budget, Facts, Report

log = logging.getLogger("memgov")
_viewed: Budget | None = None
"""The budget the views report (docs/adapters.md, "What a governed process sees"), while a claim
with a budget holds it and MEMGOV_VIEWS is on."""
_nvml_wrapped: dict[str, object] = {}
"""pynvml's own nvmlDeviceGetMemoryInfo while memgov's view replaces it."""


def _load() -> tuple[list[Adapter], list[str]]:
    """Every installed adapter, and why each broken one was skipped (logged too)."""
    found: list[Adapter] = []
    failures: list[str] = []
    seen: set[str] = set()
    for point in entry_points(group=GROUP):
        if point.name in seen:
            # Stale metadata of an earlier install (e.g. the distribution's old name's egg-info
            # beside a checkout) lists an adapter twice: apply each once.
            continue
        seen.add(point.name)
        try:
            adapter = point.load()()
        except Exception as exc:  # a broken plugin must not break the claim
            failures.append(f"adapter {point.name!r} failed to load: {exc}")
            log.warning("memgov: %s", failures[-1])
            continue
        found.append(adapter)
    return found, failures


# Loaded with this module, not at the first claim: loading imports each plugin, and a child
# forked while another thread held a plugin's import lock would wait for it forever in its own
# claim (Python gives a forked child a fresh global import lock, not fresh module locks).
_loaded, _failures = _load()


def available() -> list[Adapter]:
    """Every installed adapter (a broken plugin is logged and skipped)."""
    return list(_loaded)


def load_failures() -> list[str]:
    return list(_failures)


def facts() -> dict[str, Facts]:
    """Every installed adapter's :class:`~memgov.adapter.Facts`, by its name (the framework's)."""
    found = {}
    for adapter in _loaded:
        known = getattr(adapter, "facts", None)
        known = known if isinstance(known, Facts) else Facts()
        if not known.distributions:
            known = dataclasses.replace(known, distributions=(adapter.module,))
        found[adapter.name] = known
    return found


def any_cuda_initialized() -> bool:
    """Whether any imported framework has already initialised CUDA in this process."""
    return any(a.module in sys.modules and a.cuda_initialized() for a in available())


def govern(budget: Budget, reports: dict[str, str]) -> None:
    """Apply ``budget`` through every adapter, now or when its framework is imported.

    ``reports`` receives one line per adapter as it takes effect (a claim shows it).
    """
    global _viewed
    before = _environ_now()
    if budget.bytes is not None and _settings.get("MEMGOV_VIEWS"):
        _viewed = budget
        _importhook.when_imported("pynvml", _view_nvml)
    for adapter in available():
        mine = dataclasses.replace(budget, report=_report_into(reports, adapter.name))
        note = adapter.configure_env(mine)
        if note:
            reports[adapter.name] = note

        def apply(_module: object, adapter: Adapter = adapter, mine: Budget = mine) -> None:
            try:
                reports[adapter.name] = adapter.apply(mine)
            except Exception as exc:
                reports[adapter.name] = f"FAILED: {type(exc).__name__}: {exc}"
                log.warning("memgov: %s adapter could not apply the budget: %s", adapter.name, exc)

        _importhook.when_imported(adapter.module, apply)
    # `memgov doctor` tells these from the user's
    note_env_set(k for k, v in _environ_now().items() if before.get(k) != v)


def _environ_now() -> dict[str, str]:
    """A copy of os.environ that another thread's change cannot break: dict(os.environ) lists
    the names, then reads each, and raised KeyError when a name went in between (a release in
    another thread drops MEMGOV_HOLDER)."""
    return {k: v for k in os.environ if (v := os.environ.get(k)) is not None}


def lower(budget: Budget, reports: dict[str, str]) -> str | None:
    """Lower the caps of the imported frameworks to ``budget`` (a claim giving memory back).

    None when done (or nothing is capped: a simulated device, no framework imported yet, whose
    pending apply then reads the smaller budget); else why not: an adapter without ``lower``
    (JAX, TensorFlow: their limits are fixed at start-up) or one that declined.
    """
    global _viewed
    if _viewed is not None:
        _viewed = budget  # the views show the smaller budget from now on
    if budget.simulated:
        return None
    for adapter in available():
        if adapter.module not in sys.modules:
            continue
        lowering = getattr(adapter, "lower", None)
        line = (
            lowering(dataclasses.replace(budget, report=_report_into(reports, adapter.name)))
            if lowering is not None
            else None
        )
        if line is None:
            return f"{adapter.name} cannot lower its cap once it has started"
        reports[adapter.name] = line
    return None


def view(device_uuid: str, driver_free: int | None) -> tuple[int, int] | None:
    """:func:`memgov.adapter.budget_view`."""
    budget = _viewed
    if budget is None or budget.bytes is None or device_uuid != budget.device_uuid:
        return None
    from memgov._gpu import nvml as _nvml

    # NVML's per-process figure counts the whole process (context included); the adapters'
    # estimates cover a process NVML cannot name (a PID namespace) and what a framework keeps
    # for libraries not loaded yet (its cap sits that far below the budget).
    try:
        nvml = (_nvml.processes(device_uuid) or {}).get(os.getpid()) or 0
    except Exception:  # a simulated device NVML does not know, a driver gone
        nvml = 0
    framework = 0
    for adapter in available():
        use = getattr(adapter, "device_use", None)
        if use is not None and adapter.module in sys.modules:
            framework += use(budget) or 0
    free = max(0, budget.bytes - max(nvml, framework))
    return (free if driver_free is None else min(free, driver_free)), budget.bytes


def _view_nvml(pynvml: object) -> None:
    """pynvml's nvmlDeviceGetMemoryInfo (v1 and v2) reports the budget for the claimed device's
    handle; other devices, and every call once the claim is released, get NVML's own figures."""
    original = getattr(pynvml, "nvmlDeviceGetMemoryInfo", None)
    if original is None or _viewed is None or _nvml_wrapped:
        return

    def nvmlDeviceGetMemoryInfo(handle: object, *args: object, **kwargs: object) -> object:
        info: Any = original(handle, *args, **kwargs)
        budget = _viewed
        if budget is None:
            return info
        try:
            uuid = pynvml.nvmlDeviceGetUUID(handle)  # type: ignore[attr-defined]
            seen = view(uuid.decode() if isinstance(uuid, bytes) else str(uuid), int(info.free))
        except Exception:  # the program asked for memory info, which it got: never fail it here
            return info
        if seen is not None:
            free, total = seen
            info.total, info.free, info.used = total, free, total - free
            if hasattr(info, "reserved"):  # v2: used + reserved + free = total
                info.reserved = 0
        return info

    nvmlDeviceGetMemoryInfo.__wrapped__ = original  # type: ignore[attr-defined]
    _nvml_wrapped["original"] = original
    pynvml.nvmlDeviceGetMemoryInfo = nvmlDeviceGetMemoryInfo  # type: ignore[attr-defined]


def release() -> None:
    """The claim ended: every view reports the device's own figures again, its wrappers undone."""
    global _viewed
    _viewed = None
    original = _nvml_wrapped.pop("original", None)
    pynvml = sys.modules.get("pynvml")
    if original is not None and pynvml is not None:
        pynvml.nvmlDeviceGetMemoryInfo = original  # type: ignore[attr-defined]
    for adapter in available():
        undo = getattr(adapter, "release", None)
        if undo is not None and adapter.module in sys.modules:
            try:
                undo()
            except Exception as exc:  # a release must not fail for a view
                log.warning("memgov: %s adapter could not undo its views: %s", adapter.name, exc)


def _report_into(reports: dict[str, str], name: str) -> Report:
    def report(line: str) -> None:
        reports[name] = line

    return report
