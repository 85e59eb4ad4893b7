"""NVML per-process footprint sampler shared by the GPU checks (runs in the host PID namespace)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pynvml


class FootprintSampler:
    """Samples every process's NVML footprint on one GPU in a thread; keeps per-PID peaks."""

    def __init__(self, index: int = 0, period_s: float = 0.05) -> None:
        pynvml.nvmlInit()
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        self.period_s = period_s
        self.peaks: dict[int, int] = {}
        self.device_peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _read(self) -> None:
        procs: dict[int, int] = {}
        for lister in (
            pynvml.nvmlDeviceGetComputeRunningProcesses,
            pynvml.nvmlDeviceGetMPSComputeRunningProcesses,
        ):
            try:
                for p in lister(self.handle):
                    used = p.usedGpuMemory or 0
                    if used < 2**63:
                        procs[p.pid] = max(procs.get(p.pid, 0), used)
            except pynvml.NVMLError:
                pass
        for pid, used in procs.items():
            self.peaks[pid] = max(self.peaks.get(pid, 0), used)
        used_dev = pynvml.nvmlDeviceGetMemoryInfo(self.handle).used
        self.device_peak = max(self.device_peak, used_dev)
        self.samples += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            self._read()
            time.sleep(self.period_s)

    def __enter__(self) -> FootprintSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self._read()

    def peak_mib(self, pid: int) -> float | None:
        value = self.peaks.get(pid)
        return None if value is None else round(value / 2**20, 1)
