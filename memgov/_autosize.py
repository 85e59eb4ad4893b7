"""``auto``: the size of a claim nobody sized (``MEMGOV_CLAIM=auto``, ``claim("auto")``, ``memgov
run --claim auto``, Ray's ``budget="auto"``), and the one line that says where it came from.

In this order (docs/profiles.md):

1. **a GPU scheduler's budget** in the environment (memgov/_schedulers.py), as before;
2. **the job's profile**: the largest peak of its recorded runs (measured the way this device
   measures: NVML on a real GPU, host memory on a simulated one) x 1.10 + 64 MiB, rounded up to
   a MiB; after a run that ran out of memory, at least 1.5 x the claim it failed under, until a
   run with at least that much ends without running out;
3. **a first run** (no profile yet): half of the device's free budget now, at most a quarter of
   the device, at least :data:`FIRST_RUN_MIN`. Taken from the free budget only, it never takes
   what a neighbour holds; it leaves at least half of what is free for those who come next, and
   (soft mode) shrinks to its peak + 10 % + 64 MiB once the peak is flat (memgov/_runs.py).
   With ``wait`` it queues for the size computed when it asked.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from memgov import _config, _profiles, _schedulers, _settings
from memgov._ledger import DeviceLedger
from memgov._sizes import format_size

if TYPE_CHECKING:
    from memgov._devices import Device

AUTO = "auto"
FIRST_RUN_SHARE_OF_FREE = 0.5
FIRST_RUN_SHARE_OF_DEVICE = 0.25
FIRST_RUN_MIN = 1 * 2**30
MIB = 2**20


@dataclass(frozen=True)
class Sized:
    bytes: int
    kind: str
    """scheduler, profile or first-run"""
    line: str
    """``auto: 1.48 GiB = peak 1,358 MiB over 3 runs of main.py + 10 % + 64 MiB``"""
    notes: list[str] = field(default_factory=list)


def size_for(device: Device, job: str, label: str) -> Sized:
    """The ``auto`` size of ``job`` on ``device``."""
    notes: list[str] = []
    reading = _schedulers.read(device.total, device.visible_index)
    notes.extend(reading.problems)
    if reading.chosen is not None:
        size = reading.chosen.bytes
        return Sized(
            size, "scheduler", f"auto: {format_size(size)} = {reading.chosen.source}", notes
        )
    capacity = max(MIB, device.total - _config.reserve(device.total, device.simulated))
    try:
        profile = _profiles.read(job)
    except Exception as exc:  # a bad store or file: said, and sized as a first run
        notes.append(str(exc))
        profile = None
    learned = need(profile, device.simulated) if profile is not None else None
    if learned is not None:
        size, why = learned
        if size > capacity:
            why += f", cut to the device's {format_size(capacity)} of budget"
            size = capacity
        return Sized(size, "profile", f"auto: {format_size(size)} = {why}", notes)
    return _first_run(device, capacity, label, notes)


def _first_run(device: Device, capacity: int, label: str, notes: list[str]) -> Sized:
    free = DeviceLedger(device).snapshot().free
    cap = int(device.total * FIRST_RUN_SHARE_OF_DEVICE)
    size = min(int(free * FIRST_RUN_SHARE_OF_FREE), cap)
    size = max(size // MIB * MIB, min(FIRST_RUN_MIN, capacity))
    try:
        flat = _settings.get("MEMGOV_GIVE_BACK")
    except Exception:
        flat = None
    back = (
        f"; soft mode shrinks it to the peak + 10 % + 64 MiB once the peak is flat for {flat:g} s"
        if flat
        else ""
    )
    line = (
        f"auto: {format_size(size)} = first run of {label}: half of the "
        f"{format_size(free)} free budget, at most a quarter of the device, at least "
        f"{format_size(FIRST_RUN_MIN)}{back}"
    )
    return Sized(size, "first-run", line, notes)


def _runs_like(profile: _profiles.Profile, simulated: bool) -> list[dict[str, Any]]:
    """The runs measured the way this kind of device is (host memory vs device memory)."""
    return [r for r in profile.runs if bool(r.get("simulated")) == simulated]


def need(profile: _profiles.Profile, simulated: bool) -> tuple[int, str] | None:
    """(bytes, why) from a profile's runs on this kind of device; None when none has a peak."""
    runs = _runs_like(profile, simulated)
    peaks = [r["peak"] for r in runs if r.get("peak")]
    floor, failed = _oom_floor(runs)
    if not peaks and not floor:
        return None
    size = _profiles.margin(max(peaks)) if peaks else 0
    why = ""
    if peaks:
        runs_text = f"{len(peaks)} run{'s' if len(peaks) != 1 else ''}"
        why = (
            f"peak {max(peaks) / MIB:,.0f} MiB over {runs_text} of {profile.label} + 10 % + 64 MiB"
        )
    if floor > size:
        size = floor
        why = (
            f"{_profiles.OOM_GROWTH:g} x the {format_size(failed)} that ran out of memory in "
            f"a run of {profile.label}" + (f" ({why})" if why else "")
        )
    return size, why


def _oom_floor(runs: list[dict[str, Any]]) -> tuple[int, int]:
    """(bytes the next claim needs at least, the claim that failed); (0, 0) when no OOM stands.

    A run that ran out of memory under claim C sets the floor to 1.5 x C (rounded up to a MiB);
    a later run that ends without running out under a claim of at least the floor lifts it.
    """
    floor = failed = 0
    for run in runs:
        claim = run.get("claim") or 0
        if run.get("end") == "oom" and claim:
            grown = -(-int(claim * _profiles.OOM_GROWTH) // MIB) * MIB
            if grown > floor:
                floor, failed = grown, claim
        elif floor and claim >= floor and run.get("end") in ("exit", "released"):
            floor = failed = 0
    return floor, failed
