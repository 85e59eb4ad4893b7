"""A stand-in for NVIDIA's pynvml where no GPU exists: the devices and per-process memory that a
test writes to the JSON file named by FAKE_NVML_STATE, read afresh on every call.

    {"devices": [{"uuid": "GPU-...", "name": "...", "total": BYTES, "used": BYTES}],
     "processes": {"GPU-...": {"HOST_PID": BYTES}}}

A device's ``used`` is its own figure plus its processes'. Only the calls memgov._gpu.nvml makes
exist; the exporter tests put this folder first on PYTHONPATH so that memgov's real NVML path
(devices, attribution of host PIDs to claims) runs without a GPU.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any


class NVMLError(Exception):
    pass


def _state() -> dict[str, Any]:
    with open(os.environ["FAKE_NVML_STATE"], encoding="utf-8") as f:
        return json.load(f)


def _device(uuid: str) -> dict[str, Any]:
    for device in _state()["devices"]:
        if device["uuid"] == uuid:
            return device
    raise NVMLError(f"no device {uuid}")


@dataclass
class _Memory:
    total: int
    used: int
    free: int


@dataclass
class _Process:
    pid: int
    usedGpuMemory: int


def nvmlInit() -> None:
    _state()
    _note("init")


def nvmlShutdown() -> None:
    _note("shutdown")


def _note(call: str) -> None:
    """Append "PID CALL" to FAKE_NVML_CALLS, where a test set it (one line each)."""
    path = os.environ.get("FAKE_NVML_CALLS")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"{os.getpid()} {call}\n")


def nvmlDeviceGetCount() -> int:
    return len(_state()["devices"])


def nvmlDeviceGetHandleByIndex(index: int) -> str:
    return str(_state()["devices"][index]["uuid"])


def nvmlDeviceGetHandleByUUID(uuid: str) -> str:
    return _device(uuid)["uuid"]


def nvmlDeviceGetUUID(handle: str) -> str:
    return handle


def nvmlDeviceGetName(handle: str) -> str:
    return str(_device(handle)["name"])


def nvmlDeviceGetMemoryInfo(handle: str) -> _Memory:
    device = _device(handle)
    used = device["used"] + sum(_state().get("processes", {}).get(handle, {}).values())
    return _Memory(device["total"], used, device["total"] - used)


def nvmlDeviceGetComputeRunningProcesses(handle: str) -> list[_Process]:
    found = _state().get("processes", {}).get(handle, {})
    return [_Process(int(pid), int(used)) for pid, used in found.items()]
