"""A stand-in for nvidia-ml-py's pynvml with its memory calls' real shape: ctypes structures,
``nvmlDeviceGetMemoryInfo(handle, version=None)`` returning v1 (total, free, used) or, given
``nvmlMemory_v2``, v2 (version, total, reserved, free, used). Devices and per-process memory come
from the JSON file named by FAKE_NVML_STATE, read afresh on every call:

    {"devices": [{"uuid": "GPU-...", "total": BYTES, "used": BYTES}],
     "processes": {"GPU-...": {"PID": BYTES}}}

A device's used memory is its own figure plus its processes'.
"""

from __future__ import annotations

import json
import os
from ctypes import Structure, c_uint, c_ulonglong
from dataclasses import dataclass
from typing import Any

nvmlMemory_v2 = 0x02000028


class NVMLError(Exception):
    pass


class c_nvmlMemory_t(Structure):
    _fields_ = [("total", c_ulonglong), ("free", c_ulonglong), ("used", c_ulonglong)]


class c_nvmlMemory_v2_t(Structure):
    _fields_ = [
        ("version", c_uint),
        ("total", c_ulonglong),
        ("reserved", c_ulonglong),
        ("free", c_ulonglong),
        ("used", c_ulonglong),
    ]


@dataclass
class _Process:
    pid: int
    usedGpuMemory: int


def _state() -> dict[str, Any]:
    with open(os.environ["FAKE_NVML_STATE"], encoding="utf-8") as f:
        return json.load(f)


def _device(uuid: str) -> dict[str, Any]:
    for device in _state()["devices"]:
        if device["uuid"] == uuid:
            return device
    raise NVMLError(f"no device {uuid}")


def nvmlInit() -> None:
    _state()


def nvmlShutdown() -> None:
    pass


def nvmlDeviceGetCount() -> int:
    return len(_state()["devices"])


def nvmlDeviceGetHandleByIndex(index: int) -> str:
    return str(_state()["devices"][index]["uuid"])


def nvmlDeviceGetHandleByUUID(uuid: str) -> str:
    return str(_device(uuid)["uuid"])


def nvmlDeviceGetUUID(handle: str) -> bytes:
    return handle.encode()  # old bindings' bytes: memgov must decode it


def nvmlDeviceGetMemoryInfo(handle: str, version: int | None = None) -> Any:
    device = _device(handle)
    used = device["used"] + sum(_state().get("processes", {}).get(handle, {}).values())
    if not version:
        return c_nvmlMemory_t(device["total"], device["total"] - used, used)
    reserved = 300 * 2**20
    return c_nvmlMemory_v2_t(
        version, device["total"], reserved, device["total"] - used, used - reserved
    )


def nvmlDeviceGetComputeRunningProcesses(handle: str) -> list[_Process]:
    found = _state().get("processes", {}).get(handle, {})
    return [_Process(int(pid), int(used)) for pid, used in found.items()]
