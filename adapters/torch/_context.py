"""Make the claimed GPU's CUDA context in the background while the script goes on setting up.

A training script imports torch, then spends seconds on its own set-up (torchvision, data sets,
the model) before its first CUDA call makes the context; with many processes starting at once
under MPS the context takes seconds more. A governed process's claim is known at ``import
torch``, so a thread makes the context then, through the driver API (ctypes releases the GIL:
the script's set-up runs on meanwhile), and torch's own initialisation finds it made: the
runtime takes the device's primary context, the one retained here.

Only the driver is touched: torch's state is its own, and initialises at the first CUDA call as
without memgov. What changes is what CUDA allows after a fork: a process whose driver is
initialised cannot use CUDA in a forked child (torch's rule: CUDA in subprocesses needs the
spawn or forkserver start method). A fork waits for the thread to finish, so a child never holds
the driver half made, and a child forked after the context was started is marked as torch marks
children of a process that initialised CUDA itself, so its first CUDA call raises torch's own
"Cannot re-initialize CUDA in forked subprocess" instead of a driver error.
``MEMGOV_TORCH_WARM=off`` leaves the context to torch's first CUDA call.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import sys
import threading

DRIVER = "libcuda.so.1"
FORK_WAIT_S = 60.0
"""How long a fork or the interpreter's exit waits for the context (seconds: made in well under
one alone, in a few with 25 processes starting at once under MPS)."""

_state: dict[str, object] = {"thread": None, "started": False, "driver": False, "made": False}


def start(device_uuid: str) -> bool:
    """Start making ``device_uuid``'s context in the background, once per process; whether a
    thread was started now. Never raises: no context made here is one torch makes later."""
    if _state["started"]:
        return False
    _state["started"] = True
    thread = threading.Thread(
        target=_make, args=(device_uuid,), name="memgov-cuda-context", daemon=True
    )
    try:
        thread.start()
    except RuntimeError:  # no thread to be had: torch makes the context itself
        return False
    _state["thread"] = thread
    return True


def made() -> bool:
    """Whether the context was made here (for tests and reports)."""
    return bool(_state["made"])


def wait(timeout: float = FORK_WAIT_S) -> None:
    """Until the thread is done (or ``timeout``): a fork or the exit never finds it in the
    driver. A daemon thread, so a driver that never answers cannot keep the program alive."""
    thread = _state["thread"]
    if isinstance(thread, threading.Thread) and thread is not threading.current_thread():
        thread.join(timeout)


def _make(device_uuid: str) -> None:
    try:
        driver = ctypes.CDLL(DRIVER)
        if driver.cuInit(0) != 0:
            return
        _state["driver"] = True
        device = _device(driver, device_uuid)
        if device is None:
            return
        context = ctypes.c_void_p()
        # Retained for the life of the process, as torch's own use keeps it.
        if driver.cuDevicePrimaryCtxRetain(ctypes.byref(context), device) == 0:
            _state["made"] = True
    except Exception:  # no driver, no such symbol: torch makes the context at its first call
        return


def _device(driver: ctypes.CDLL, device_uuid: str) -> ctypes.c_int | None:
    """The driver's handle of the device NVML names ``device_uuid`` (``GPU-xxxxxxxx-...``)."""
    count = ctypes.c_int()
    if driver.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return None
    for ordinal in range(count.value):
        device = ctypes.c_int()
        raw = (ctypes.c_ubyte * 16)()
        if driver.cuDeviceGet(ctypes.byref(device), ordinal) != 0:
            continue
        if driver.cuDeviceGetUuid(raw, device) != 0:
            continue
        if uuid_text(bytes(raw)) == device_uuid:
            return device
    return None


def uuid_text(raw: bytes) -> str:
    """The driver's 16 UUID bytes as NVML writes them: ``GPU-`` and 8-4-4-4-12 hex digits."""
    text = raw.hex()
    return f"GPU-{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


def _in_child() -> None:
    # The thread does not exist here (the fork waited for it); the driver it initialised is the
    # parent's, unusable in this process.
    _state["thread"] = None
    torch_cuda = sys.modules.get("torch.cuda")
    if _state["driver"] and torch_cuda is not None:
        # As torch marks a child of a process that initialised CUDA itself (torch.cuda reads
        # this name at every call): its first CUDA call says to use spawn, not a driver error.
        torch_cuda._is_in_bad_fork = lambda: True  # type: ignore[attr-defined]


os.register_at_fork(before=wait, after_in_child=_in_child)
atexit.register(wait)
