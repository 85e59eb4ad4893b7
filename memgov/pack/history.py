"""Measured peaks of finished pack jobs, so ``memgov pack --claim auto`` can size the next claim.

One store, not two: pack keeps its measurements in the profile store of the user who runs it
(memgov/_profiles/store.py: ``$MEMGOV_DIR/v1/_profiles/<uid>/``, private, bounded, written whole or
not at all), as the runs of a job named ``<experiment>-<framework>-b<batch>`` (device peaks) and
``...-host-...`` (host USS). ``memgov profiles`` lists them beside every other job's.

Each run is the whole-process peak (NVML, CUDA context included) of a job that finished cleanly
under a memgov budget (never greedy runs: a framework's preallocation is not a need, and never
rogue jobs). The auto size is the profiles' rule, ``max(peaks) x 1.10 + 64 MiB`` rounded up to
a whole MiB (memgov/_profiles/autosize.py).
"""

from __future__ import annotations

import re
import time
from typing import Any

from memgov._profiles import autosize as _autosize, store as _profiles

KEEP = _profiles.KEEP
MARGIN_FRACTION = _profiles.MARGIN_FRACTION
MARGIN_BYTES = _profiles.MARGIN_BYTES
_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


def key(experiment: str, framework: str, batch: int) -> str:
    return _SAFE.sub("_", f"{experiment}-{framework}-b{batch}")


def margin(peak: int) -> int:
    """The documented auto size for a measured peak (bytes), rounded up to a whole MiB."""
    return _profiles.margin(peak)


def read(name: str) -> list[dict[str, Any]]:
    """The recorded peaks of ``name`` (oldest first, each with its ``bytes``); [] when there are
    none. A profile file that is not one raises ProfileError (a LedgerError) saying which."""
    profile = _profiles.read(name)
    if profile is None:
        return []
    return [{**run, "bytes": run["peak"]} for run in profile.runs if run.get("peak")]


def record(name: str, peaks: list[int], **info: Any) -> list[dict[str, Any]]:
    """Add measured peaks (bytes) of finished jobs; keep the last KEEP. Returns what is kept."""
    if not peaks:
        return read(name)
    now = time.time()
    runs = [
        {
            "peak": int(p),
            "end": "exit",
            "time": now,
            "claim": None,
            "sized": "pack",
            "measure": "pack",
            "simulated": False,
            "pack": info,
        }
        for p in peaks
    ]
    profile = _profiles.record(name, name, runs, command=f"memgov pack ({name})")
    return [{**run, "bytes": run["peak"]} for run in profile.runs if run.get("peak")]


def largest(name: str) -> int | None:
    """The largest recorded peak of ``name`` (bytes), or None when nothing is recorded."""
    return max((p["bytes"] for p in read(name)), default=None)


def auto_size(name: str) -> tuple[int, str] | None:
    """(bytes, where they come from) for ``--claim auto``, or None when nothing is recorded."""
    profile = _profiles.read(name)
    found = None if profile is None else _autosize.need(profile, simulated=False)
    if found is None:
        return None
    size, why = found
    return size, f"auto: {size / 2**20:,.0f} MiB = {why}"
