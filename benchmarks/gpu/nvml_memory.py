"""NVML's share of the exporter's memory: one fresh interpreter, measured at each step.

    python3 benchmarks/gpu/nvml_memory.py [--readings 10] [--out PATH.json]

The interpreter first imports what `python -m memgov.exporter` imports (no NVML yet), then
pynvml, initialises NVML through memgov._gpu.nvml, and makes --readings readings as the exporter's
refresher makes them (memgov.exporter.model.read, in a thread of their own: the ledger of
MEMGOV_DIR and every GPU's processes from NVML). After each step it reads its own smaps_rollup
(RSS, PSS, USS, anonymous), the resident pages of libnvidia-ml.so and of /dev/nvidia* mappings,
and its threads. Then what can give memory back: glibc's malloc_trim(0), nvmlShutdown (and trim),
and what a new nvmlInit and reading would cost if NVML were shut down between refreshes (their
time, and the memory after them). Run it beside the load the exporter is measured in (pack's
140 jobs: NVML's process lists are full), with the exporter's environment (MALLOC_ARENA_MAX=1,
as `memgov exporter` sets it) and without (glibc's default, one arena per thread).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))
import smaps  # benchmarks/common/smaps.py

NVML_GROUPS = ("nvml library (libnvidia-ml.so)", "device files (/dev/nvidia*)")


def snapshot(step: str, seconds: float | None = None) -> dict[str, Any]:
    pid = os.getpid()
    totals = smaps.rollup(pid)
    groups = {g["group"]: g for g in smaps.breakdown(pid)}
    found: dict[str, Any] = {
        "step": step,
        "rss_kb": totals["Rss"],
        "pss_kb": totals["Pss"],
        "uss_kb": totals["Uss"],
        "anonymous_kb": totals["Anonymous"],
        "threads": len(os.listdir("/proc/self/task")),
        "seconds": seconds,
    }
    for name in NVML_GROUPS:
        group = groups.get(name, {})
        key = "nvml_library" if name.startswith("nvml") else "nvidia_devices"
        found[f"{key}_rss_kb"] = group.get("rss_kb", 0)
        found[f"{key}_pss_kb"] = group.get("pss_kb", 0)
    return found


def in_thread(work: Any) -> float:
    """Run ``work`` in a new thread, as the exporter's refresher does; its wall time."""
    start = time.perf_counter()
    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    return time.perf_counter() - start


def trim() -> float:
    start = time.perf_counter()
    ctypes.CDLL(None).malloc_trim(0)
    return time.perf_counter() - start


def measure(readings: int) -> list[dict[str, Any]]:
    steps = [snapshot("start (python, this script)")]
    import memgov.exporter.serve  # noqa: F401  (what the serving process imports)
    from memgov._gpu import nvml as _nvml
    from memgov.exporter import model

    steps.append(snapshot("imports of python -m memgov.exporter"))
    start = time.perf_counter()
    import pynvml  # noqa: F401  (what NVML's use imports)

    steps.append(snapshot("import pynvml", time.perf_counter() - start))
    start = time.perf_counter()
    reason = _nvml.unavailable_reason()
    steps.append(snapshot(f"nvmlInit ({reason or 'ok'})", time.perf_counter() - start))
    seconds = in_thread(lambda: [model.read() for _ in range(readings)])
    steps.append(snapshot(f"{readings} readings (ledger and NVML) in a thread", seconds))
    steps.append(snapshot("malloc_trim(0)", trim()))
    if reason is None:
        start = time.perf_counter()
        _nvml.shutdown()  # as the exporter's --release-nvml does after each refresh
        trim()
        steps.append(snapshot("nvmlShutdown, malloc_trim(0)", time.perf_counter() - start))
        start = time.perf_counter()
        _nvml.unavailable_reason()
        steps.append(snapshot("nvmlInit again", time.perf_counter() - start))
        steps.append(snapshot("one reading after it", in_thread(model.read)))
    return steps


def show(steps: list[dict[str, Any]]) -> None:
    print(
        f"MALLOC_ARENA_MAX={os.environ.get('MALLOC_ARENA_MAX', '(unset)')}; python "
        f"{sys.version.split()[0]}; MiB (kB / 1024); seconds of the step"
    )
    print(
        f"{'RSS':>7} {'PSS':>7} {'USS':>7} {'anon':>7} {'nvml.so':>8} {'/dev':>6} {'thr':>4} "
        f"{'s':>7}  step"
    )
    for s in steps:
        sec = "" if s["seconds"] is None else f"{s['seconds']:.3f}"
        print(
            f"{s['rss_kb'] / 1024:7.2f} {s['pss_kb'] / 1024:7.2f} {s['uss_kb'] / 1024:7.2f} "
            f"{s['anonymous_kb'] / 1024:7.2f} {s['nvml_library_rss_kb'] / 1024:8.2f} "
            f"{s['nvidia_devices_rss_kb'] / 1024:6.2f} {s['threads']:4d} {sec:>7}  {s['step']}"
        )
    base = steps[1]
    after = steps[4]
    print(
        f"NVML's share (pynvml, nvmlInit and the readings, over the exporter's imports): RSS "
        f"+{(after['rss_kb'] - base['rss_kb']) / 1024:.2f} MiB, PSS "
        f"+{(after['pss_kb'] - base['pss_kb']) / 1024:.2f} MiB, USS "
        f"+{(after['uss_kb'] - base['uss_kb']) / 1024:.2f} MiB; of it libnvidia-ml.so's pages "
        f"RSS {after['nvml_library_rss_kb'] / 1024:.2f} MiB (PSS "
        f"{after['nvml_library_pss_kb'] / 1024:.2f} MiB)",
        flush=True,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--readings", type=int, default=10)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    steps = measure(args.readings)
    show(steps)
    print(smaps.show(os.getpid()), flush=True)
    if args.out is not None:
        report = {
            "malloc_arena_max": os.environ.get("MALLOC_ARENA_MAX"),
            "python": sys.version,
            "cpus": os.cpu_count(),
            "memgov_dir": os.environ.get("MEMGOV_DIR"),
            "steps": steps,
            "breakdown_kb": smaps.breakdown(os.getpid()),
        }
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
