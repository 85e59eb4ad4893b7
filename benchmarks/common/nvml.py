"""The NVML samplers every GPU benchmark uses (one module: they run in the host PID namespace).

Background: a sampler's thread, running inside ``with``. FootprintSampler: each process's peak
footprint on one GPU, the device's peak and its use over time. LoadSampler: host CPU load and GPU
utilization, timestamped. process_usage: one reading of every process's footprint, for scripts
that sample more than memory (mps_density.py).
Import with ``sys.path.insert(0, str(BENCHMARKS / "common"))`` then ``from nvml import ...``.
"""

from __future__ import annotations

import threading
import time
from typing import Any, TypeVar

import pynvml

MIB = 2**20
B = TypeVar("B", bound="Background")
NOT_AVAILABLE = 2**63
"""NVML reports a process's memory as 2**64 - 1 where it cannot see it (no permission, MPS)."""


def process_usage(handle: Any) -> dict[int, int]:
    """Bytes each process holds on the device, from both NVML lists (plain and MPS clients)."""
    procs: dict[int, int] = {}
    for lister in (
        pynvml.nvmlDeviceGetComputeRunningProcesses,
        pynvml.nvmlDeviceGetMPSComputeRunningProcesses,
    ):
        try:
            for p in lister(handle):
                used = p.usedGpuMemory or 0
                if used < NOT_AVAILABLE:
                    procs[p.pid] = max(procs.get(p.pid, 0), used)
        except pynvml.NVMLError:
            pass
    return procs


class Background:
    """A sampling thread (``_run``, ending once ``_stop`` is set), run while inside ``with``."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        raise NotImplementedError

    def __enter__(self: B) -> B:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


class FootprintSampler(Background):
    """Samples every process's NVML footprint on one GPU in a thread; keeps per-PID peaks, the
    device's peak and a timeline of (seconds, device MiB used, processes).

    ``index=None`` is a dry run (no NVML: nothing sampled, for checking a script on a CPU)."""

    def __init__(self, index: int | None = 0, period_s: float = 0.05) -> None:
        self.handle: Any = None
        if index is not None:
            pynvml.nvmlInit()
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        self.period_s = period_s
        self.peaks: dict[int, int] = {}
        self.device_peak = 0
        self.samples = 0
        self.timeline: list[tuple[float, float, int]] = []
        self._t0 = time.monotonic()
        super().__init__()

    def device(self) -> dict[str, Any]:
        """The GPU's name, total memory and driver (a dry run names itself)."""
        if self.handle is None:
            return {"name": "cpu (dry run)"}
        name = pynvml.nvmlDeviceGetName(self.handle)
        return {
            "name": name.decode() if isinstance(name, bytes) else name,
            "total_mib": pynvml.nvmlDeviceGetMemoryInfo(self.handle).total / MIB,
            "driver": str(pynvml.nvmlSystemGetDriverVersion()),
        }

    def used_mib(self) -> float:
        if self.handle is None:
            return 0.0
        return float(pynvml.nvmlDeviceGetMemoryInfo(self.handle).used / MIB)

    def _read(self) -> None:
        if self.handle is None:
            return
        try:
            procs = process_usage(self.handle)
            used_dev = pynvml.nvmlDeviceGetMemoryInfo(self.handle).used
        except pynvml.NVMLError:
            return  # a missed sample, not a failed benchmark
        for pid, used in procs.items():
            self.peaks[pid] = max(self.peaks.get(pid, 0), used)
        self.device_peak = max(self.device_peak, used_dev)
        self.samples += 1
        elapsed = round(time.monotonic() - self._t0, 2)
        self.timeline.append((elapsed, round(used_dev / MIB), len(procs)))

    def _run(self) -> None:
        while not self._stop.is_set():
            self._read()
            time.sleep(self.period_s)

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        self._read()  # a last sample: the peak of a run that ended between two

    def peak_mib(self, pid: int) -> float | None:
        value = self.peaks.get(pid)
        return None if value is None else round(value / MIB, 1)


class LoadSampler(Background):
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
        super().__init__()

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
            self.samples.append(
                {
                    "t": t_now,
                    "cpu_busy": round(1 - (now[1] - before[1]) / total, 4) if total else None,
                    "runnable": float(now[2]),
                    "switches_per_s": round((now[3] - before[3]) / (t_now - t_before), 1),
                    "gpu_util": gpu,
                }
            )
            before, t_before = now, t_now

    def means(self, lo: float | None = None, hi: float | None = None) -> dict[str, Any]:
        """Mean of each series over the samples taken in [lo, hi] (all samples by default)."""
        inside = [
            s for s in self.samples if (lo is None or s["t"] >= lo) and (hi is None or s["t"] <= hi)
        ]
        out: dict[str, Any] = {"samples": len(inside)}
        for key in ("cpu_busy", "runnable", "switches_per_s", "gpu_util"):
            values = [s[key] for s in inside if s[key] is not None]
            out[key] = round(sum(values) / len(values), 3) if values else None  # type: ignore[arg-type]
        return out
