"""``auto``: the size of a claim nobody sized (``MEMGOV_CLAIM=auto``, ``claim("auto")``, ``memgov
run --claim auto``, Ray's ``budget="auto"``), and the one line that says where it came from.

In this order (docs/profiles.md):

1. **a GPU scheduler's budget** in the environment (memgov/_gpu/schedulers.py), as before;
2. **the job's profile**: the largest peak of its recorded runs (measured the way this device
   measures: NVML on a real GPU, host memory on a simulated one) x 1.10 + 64 MiB, rounded up to
   a MiB; after a run that ran out of memory, at least 1.5 x the claim it failed under, until a
   run with at least that much ends without running out; at most OOM_GROWTHS such growths in a
   row (a job that runs out whatever it gets stops growing, and its line says so);
3. **a sibling's first run**: while another process of this user runs the job's first run (it
   holds the job's ``.first`` lock, memgov/_profiles/store.py), a claim of the same job waits for it
   to end, up to :data:`FIRST_RUN_WAIT_S`, and is then sized from the profile it left: copies of
   one job started at once are never sized blind into an OOM. Past the wait it is a first run
   at least that sibling's peak so far + 10 % + 64 MiB;
4. **a first run** (no profile yet): half of the device's free budget now, at most a quarter of
   the device, at least :data:`FIRST_RUN_MIN`. Taken from the free budget only, it never takes
   what a neighbour holds; it leaves at least half of what is free for those who come next, and
   (soft mode) shrinks to its peak + 10 % + 64 MiB once the peak is flat (memgov/_runs.py).
   With ``wait`` it queues for the size computed when it asked.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from memgov._base import config as _config, settings as _settings
from memgov._base.sizes import format_size
from memgov._gpu import schedulers as _schedulers
from memgov._ledger.ledger import DeviceLedger
from memgov._profiles import store as _profiles

if TYPE_CHECKING:
    from memgov._gpu.devices import Device

AUTO = "auto"
FIRST_RUN_SHARE_OF_FREE = 0.5
FIRST_RUN_SHARE_OF_DEVICE = 0.25
FIRST_RUN_MIN = 1 * 2**30
FIRST_RUN_WAIT_S = 300.0
"""How long a claim waits for a running sibling's first run of its job to end (then it is sized
from the profile that run left). Chosen on the PyTorch examples' MNIST, VAE and DCGAN (one epoch:
under a minute alone on an H100 or H200): a short job's copies wait for one whole run; a longer
job's copies start after this, sized at least at the first run's peak so far."""
MIB = 2**20

_gave_up: set[str] = set()
"""Jobs whose sibling this process waited FIRST_RUN_WAIT_S for (size_for runs once per candidate
device: the wait is spent once)."""


@dataclass(frozen=True)
class Sized:
    bytes: int
    kind: str
    """scheduler, profile or first-run"""
    line: str
    """``auto: 1.48 GiB = peak 1,358 MiB over 3 runs of main.py + 10 % + 64 MiB``"""
    notes: list[str] = field(default_factory=list)


def size_for(device: Device, job: str, label: str, sibling: bool = False) -> Sized:
    """The ``auto`` size of ``job`` on ``device``. ``sibling``: this process claims for itself
    (memgov/_claim.py): a first run waits for a sibling's first run of the job (see above);
    planners (the queue) size without waiting or holding anything."""
    notes: list[str] = []
    reading = _schedulers.read(device.total, device.visible_index)
    notes.extend(reading.problems)
    if reading.chosen is not None:
        size = reading.chosen.bytes
        return Sized(
            size, "scheduler", f"auto: {format_size(size)} = {reading.chosen.source}", notes
        )
    capacity = max(MIB, device.total - _config.reserve(device.total, device.simulated))
    sized = _from_profile(device, capacity, job, notes)
    if sized is not None or not sibling:
        return sized or _first_run(device, capacity, label, notes, 0)
    waited, holder = _wait_for_sibling(job, label, notes)
    sized = _from_profile(device, capacity, job, notes) if waited is not None else None
    if sized is not None:
        _profiles.end_first(job)  # sized from the sibling's run: not a first run
        line = f"{sized.line}; waited {waited:.0f} s for the first run of {label} (pid {holder})"
        return Sized(sized.bytes, sized.kind, line, notes)
    peak = _profiles.live_peak(job) if holder else 0
    return _first_run(device, capacity, label, notes, peak)


def _from_profile(device: Device, capacity: int, job: str, notes: list[str]) -> Sized | None:
    try:
        profile = _profiles.read(job)
    except Exception as exc:  # a bad store or file: said, and sized as a first run
        if str(exc) not in notes:
            notes.append(str(exc))
        return None
    learned = need(profile, device.simulated) if profile is not None else None
    if learned is None:
        return None
    size, why = learned
    if size > capacity:
        why += f", cut to the device's {format_size(capacity)} of budget"
        size = capacity
    return Sized(size, "profile", f"auto: {format_size(size)} = {why}", notes)


def _wait_for_sibling(job: str, label: str, notes: list[str]) -> tuple[float | None, int]:
    """Take ``job``'s first-run lock, waiting while a sibling holds it: (seconds waited, the
    sibling's PID); (None, 0) when no sibling ran; (None, PID) when it still runs after
    FIRST_RUN_WAIT_S, or is this process's ancestor (a child never waits for its parent's run,
    which may wait for the child), or the store failed meanwhile."""
    try:
        holder = _profiles.hold_first(job)
    except Exception as exc:  # no store: no sibling can be seen; sized as a first run
        notes.append(str(exc))
        return None, 0
    if holder is None:
        return None, 0
    if job in _gave_up or _ancestor(holder):
        return None, holder
    start = time.monotonic()
    if not _settings.quiet():
        sys.stderr.write(
            f"memgov: auto: waiting up to {FIRST_RUN_WAIT_S:g} s for the first run of {label} "
            f"(pid {holder}) to end, to be sized from its peak\n"
        )
        sys.stderr.flush()
    delay = 0.05
    while True:
        left = start + FIRST_RUN_WAIT_S - time.monotonic()
        if left <= 0:
            _gave_up.add(job)
            return None, holder
        time.sleep(min(delay, left))  # a flock is only ever tried (memgov/_files/flock.py, Bounds)
        delay = min(delay * 2, 0.5)
        try:
            found = _profiles.hold_first(job)
        except Exception as exc:  # the store failed meanwhile: sized as a first run
            notes.append(str(exc))
            _gave_up.add(job)
            return None, holder
        if found is None:
            return time.monotonic() - start, holder
        holder = found or holder  # 0: the holder had not written its PID when looked at


def _ancestor(pid: int) -> bool:
    """Whether ``pid`` is this process or one of its ancestors (/proc's parent links)."""
    me = os.getpid()
    for _ in range(64):
        if me == pid:
            return True
        if me <= 1:
            return False
        try:
            with open(f"/proc/{me}/stat", "rb") as f:
                me = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
    return False


def _first_run(device: Device, capacity: int, label: str, notes: list[str], peak: int) -> Sized:
    free = DeviceLedger(device).snapshot().free
    cap = int(device.total * FIRST_RUN_SHARE_OF_DEVICE)
    size = min(int(free * FIRST_RUN_SHARE_OF_FREE), cap)
    floor = min(max(FIRST_RUN_MIN, _profiles.margin(peak) if peak else 0), capacity)
    size = max(size // MIB * MIB, floor)
    try:
        flat = _settings.get("MEMGOV_GIVE_BACK")
    except Exception:
        flat = None
    back = (
        f"; soft mode shrinks it to the peak + 10 % + 64 MiB once the peak is flat for {flat:g} s"
        if flat
        else ""
    )
    least = (
        f"the peak so far of a sibling's first run ({peak / MIB:,.0f} MiB) + 10 % + 64 MiB"
        if peak and floor > FIRST_RUN_MIN
        else format_size(FIRST_RUN_MIN)
    )
    line = (
        f"auto: {format_size(size)} = first run of {label}: half of the "
        f"{format_size(free)} free budget, at most a quarter of the device, at least "
        f"{least}{back}"
    )
    return Sized(size, "first-run", line, notes)


def _runs_like(profile: _profiles.Profile, simulated: bool) -> list[dict[str, Any]]:
    """The runs measured the way this kind of device is (host memory vs device memory)."""
    return [r for r in profile.runs if bool(r.get("simulated")) == simulated]


def need(profile: _profiles.Profile, simulated: bool) -> tuple[int, str] | None:
    """(bytes, why) from a profile's runs on this kind of device; None when none has a peak."""
    runs = _runs_like(profile, simulated)
    peaks = [r["peak"] for r in runs if r.get("peak")]
    grown = _oom_floor(runs)
    if not peaks and not grown.floor:
        return None
    size = _profiles.margin(max(peaks)) if peaks else 0
    why = ""
    if peaks:
        runs_text = f"{len(peaks)} run{'s' if len(peaks) != 1 else ''}"
        why = (
            f"peak {max(peaks) / MIB:,.0f} MiB over {runs_text} of {profile.label} + 10 % + 64 MiB"
        )
    if grown.floor > size:
        size = grown.floor
        why = (
            f"{_profiles.OOM_GROWTH:g} x the {format_size(grown.failed)} that ran out of memory in "
            f"a run of {profile.label}" + (f" ({why})" if why else "")
        )
        if len(grown.chain) > 1:
            steps = " -> ".join(format_size(c) for c in (*grown.chain, grown.floor))
            why += f"; grown after each run that ran out of memory: {steps}"
        if grown.stopped:
            why += (
                f"; not grown further: {grown.stopped} more run{'s' if grown.stopped > 1 else ''}"
                f" ran out at that size too, and a claim grows at most {_profiles.OOM_GROWTHS} "
                f"times in a row ({_profiles.OOM_GROWTH**_profiles.OOM_GROWTHS:g} x the first "
                "that ran out): the job runs out whatever it gets; find why, or give it a size"
            )
    return size, why


@dataclass
class _Grown:
    floor: int = 0
    """Bytes the next claim needs at least (0: no OOM stands)."""
    failed: int = 0
    """The claim whose OOM set the floor."""
    chain: list[int] = field(default_factory=list)
    """The claims that ran out of memory, each growing the floor, in order."""
    stopped: int = 0
    """Runs that ran out at the floor after OOM_GROWTHS growths (the floor stayed)."""


def _oom_floor(runs: list[dict[str, Any]]) -> _Grown:
    """What the OOMs standing in ``runs`` ask of the next claim.

    A run that ran out of memory under claim C sets the floor to 1.5 x C (rounded up to a MiB),
    at most OOM_GROWTHS times in a row; a later run that ends without running out under a claim
    of at least the floor lifts it.
    """
    grown = _Grown()
    for run in runs:
        claim = run.get("claim") or 0
        if run.get("end") == "oom" and claim:
            size = -(-int(claim * _profiles.OOM_GROWTH) // MIB) * MIB
            if size <= grown.floor:
                continue
            if len(grown.chain) >= _profiles.OOM_GROWTHS:
                grown.stopped += 1
                continue
            grown.floor, grown.failed = size, claim
            grown.chain.append(claim)
        elif grown.floor and claim >= grown.floor and run.get("end") in ("exit", "released"):
            grown = _Grown()
    return grown
