"""Everything memgov asks NVML, with its quirks handled here and nowhere else.

Quirks: old bindings return bytes where new ones return str; a process's memory can be "not
available" (a sentinel or None, e.g. under MIG or in some containers); compute, graphics and MPS
client lists overlap; NVML reports host PIDs even inside a PID namespace (see _attribution).
NVML is initialised once per process, lazily (again after :func:`shutdown`), and never by
``import memgov``.
"""

from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass
from typing import Any

_NOT_AVAILABLE = 2**64 - 1
_lock = threading.Lock()
_state: dict[str, Any] = {}


def _fresh_lock_in_child() -> None:
    # A lock held at fork() time (a thread asking NVML) stays held in the forked
    # child, where that thread does not exist: the child's first use would wait forever.
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_fresh_lock_in_child)


@dataclass(frozen=True)
class NvmlDevice:
    index: int
    uuid: str
    name: str
    total: int
    used: int


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _nvml() -> Any | None:
    """The initialised pynvml module, or None when there is no usable NVML (no driver, no GPU)."""
    with _lock:
        if "module" in _state:
            return _state["module"]
        try:
            import pynvml

            pynvml.nvmlInit()
            module: Any | None = pynvml
            _state["error"] = None
        except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, DriverNotLoaded...
            module = None
            _state["error"] = f"{type(exc).__name__}: {exc}"
        _state["module"] = module
        return module


def _memory_info(nv: Any) -> Any:
    """NVML's own nvmlDeviceGetMemoryInfo: inside a claim the program's pynvml shows the budget
    (memgov/_adapters.py), and memgov itself needs the card's figures."""
    function = nv.nvmlDeviceGetMemoryInfo
    return getattr(function, "__wrapped__", function)


def shutdown() -> None:
    """Shut NVML down in this process; the next call initialises it again. The exporter's
    ``--release-nvml`` does this after each refresh, so that NVML's state is not kept resident
    between refreshes (docs/metrics.md, "Memory")."""
    with _lock:
        module = _state.pop("module", None)
        _state.pop("error", None)
        if module is not None:
            # A driver gone meanwhile: the next initialisation says so.
            with contextlib.suppress(Exception):
                module.nvmlShutdown()


def unavailable_reason() -> str | None:
    """Why NVML could not be used, or None when it works."""
    _nvml()
    return _state.get("error")


def devices() -> list[NvmlDevice]:
    nv = _nvml()
    if nv is None:
        return []
    found = []
    for index in range(nv.nvmlDeviceGetCount()):
        handle = nv.nvmlDeviceGetHandleByIndex(index)
        memory = _memory_info(nv)(handle)
        found.append(
            NvmlDevice(
                index=index,
                uuid=_text(nv.nvmlDeviceGetUUID(handle)),
                name=_text(nv.nvmlDeviceGetName(handle)),
                total=int(memory.total),
                used=int(memory.used),
            )
        )
    return found


def memory(uuid: str) -> tuple[int, int]:
    """(total, used) bytes of one device, read now."""
    nv = _nvml()
    if nv is None:
        raise RuntimeError(f"NVML is not available: {unavailable_reason()}")
    info = _memory_info(nv)(nv.nvmlDeviceGetHandleByUUID(uuid))
    return int(info.total), int(info.used)


def processes(uuid: str) -> dict[int, int | None] | None:
    """Host PID -> device bytes (None where NVML cannot say) for every process on the device.

    Returns None when NVML cannot list processes at all, which callers must not read as "no
    processes".
    """
    nv = _nvml()
    if nv is None:
        return None
    handle = nv.nvmlDeviceGetHandleByUUID(uuid)
    found: dict[int, int | None] = {}
    listers = [
        "nvmlDeviceGetComputeRunningProcesses",
        "nvmlDeviceGetGraphicsRunningProcesses",
        "nvmlDeviceGetMPSComputeRunningProcesses",
    ]
    listed_any = False
    for lister in listers:
        try:
            entries = getattr(nv, lister)(handle)
        except Exception:  # not supported on this driver/GPU, or the function is missing
            continue
        listed_any = True
        for entry in entries:
            used = entry.usedGpuMemory
            used = None if used is None or used == _NOT_AVAILABLE else int(used)
            previous = found.get(entry.pid)
            # The same PID shows in several lists (e.g. compute and MPS); keep the largest figure.
            found[entry.pid] = used if previous is None else max(previous, used or 0)
    return found if listed_any else None
