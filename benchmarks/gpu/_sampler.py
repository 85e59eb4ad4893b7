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


class LoadSampler:
    """Host CPU busy fraction, runnable tasks and GPU utilization every ``period_s``, timestamped
    (wall clock), so a run's samples can be cut to the window a figure comes from.

    CPU: /proc/stat deltas (busy = not idle and not iowait). GPU: NVML's utilization (the share of
    the period in which any kernel ran: below 100 the GPU had idle gaps); none with
    gpu_index=None or where NVML does not start."""

    def __init__(self, period_s: float = 0.5, gpu_index: int | None = 0) -> None:
        self.period_s = period_s
        self.samples: list[dict[str, float | None]] = []
        self._handle: Any = None
        if gpu_index is not None:
            try:
                pynvml.nvmlInit()
                self._handle = pynvml.nvmlDeviceGetHandleByIndex(gpu_index)
            except pynvml.NVMLError:
                self._handle = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _stat() -> tuple[int, int, int, int]:
        with open("/proc/stat") as f:
            lines = f.read().splitlines()
        fields = [int(x) for x in lines[0].split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        running = next((int(x.split()[1]) for x in lines if x.startswith("procs_running")), 0)
        switches = next((int(x.split()[1]) for x in lines if x.startswith("ctxt")), 0)
        return sum(fields), idle, running, switches

    def _run(self) -> None:
        before, t_before = self._stat(), time.time()
        while not self._stop.wait(self.period_s):
            now, t_now = self._stat(), time.time()
            total = now[0] - before[0]
            gpu: float | None = None
            if self._handle is not None:
                try:
                    gpu = float(pynvml.nvmlDeviceGetUtilizationRates(self._handle).gpu)
                except pynvml.NVMLError:
                    gpu = None
            self.samples.append({
                "t": t_now,
                "cpu_busy": round(1 - (now[1] - before[1]) / total, 4) if total else None,
                "runnable": float(now[2]),
                "switches_per_s": round((now[3] - before[3]) / (t_now - t_before), 1),
                "gpu_util": gpu,
            })
            before, t_before = now, t_now

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()

    def means(self, lo: float | None = None, hi: float | None = None) -> dict[str, Any]:
        """Mean of each series over the samples taken in [lo, hi] (all samples by default)."""
        inside = [s for s in self.samples
                  if (lo is None or s["t"] >= lo) and (hi is None or s["t"] <= hi)]
        out: dict[str, Any] = {"samples": len(inside)}
        for key in ("cpu_busy", "runnable", "switches_per_s", "gpu_util"):
            values = [s[key] for s in inside if s[key] is not None]
            out[key] = round(sum(values) / len(values), 3) if values else None  # type: ignore[arg-type]
        return out
