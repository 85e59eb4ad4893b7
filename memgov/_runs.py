"""This process's run: its peak footprint sampled while it lives, how it ended, into its profile.

Every claim starts a run (memgov/_claim.py). What is measured, by a daemon thread that wakes once a
second (one blocking wait, cut short by finish()):

- a real GPU: this process's device memory as NVML counts it (CUDA context included); where
  NVML cannot see the process (inside a PID namespace), torch's peak reserved memory
  (``torch-reserved``: the context is not in it);
- a simulated GPU (``MEMGOV_DEVICES``): no device memory exists, so the process's peak resident
  host memory (``host-rss``, VmHWM) stands in; runs measured one way never size claims of the
  other kind of device.

NVML is asked every second only while the peak rises: once a look finds it flat, the next look
waits twice as long, up to NVML_EVERY_MAX_S, and torch's own high-water mark (read every second:
the allocator's counter, no driver call) growing brings the next look forward to now. With 25
jobs on one GPU that is a few driver queries a minute per job instead of four a second, against
training work that needs the same driver; the peak stays exact for what torch allocates (see
measure()), and the last sample, taken when the run ends, always asks NVML.

Crash safety: the run lives in a flock-held file of this user's profile store
(memgov/_profiles/store.py, ``live/``), rewritten whenever the peak grows. A process that ends
normally (or releases its claim) folds its run into its profile itself; one killed by a signal
leaves its file unlocked, and the next reader of the store (an ``auto`` claim, ``memgov profiles``)
folds its last sampled peak in as ``killed``. An out-of-memory error that ends the program is caught
by a ``sys.excepthook`` wrapper and recorded as ``oom``, so the next ``auto`` asks for more; with
what it asked for when it ran out (``asked``), where torch's error says.

Give back: a soft first-run ``auto`` claim shrinks to its peak + 10 % + 64 MiB once the peak has
not risen (by more than 16 MiB or 1 %) for MEMGOV_GIVE_BACK seconds (default 120) of GPU work:
counted from when torch's cap is applied and its allocator holds memory (a simulated GPU: from
the start). Only if every framework in the process can lower its cap (torch can, unless it
already holds more than the smaller budget; JAX and TensorFlow fix theirs at start-up); the
claim record is rewritten under the device's admission lock, so the budget returns to the ledger
for others. Once per run.
"""

from __future__ import annotations

import _thread
import atexit
import contextlib
import dataclasses
import os
import socket
import sys
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Protocol

# Imported here, not where used: claim() starts a run, and an import inside it would hold that
# module's import lock while another thread may fork (memgov/_claim.py). Nothing here imports
# memgov._claim, which imports this module: a run knows its claim as a Claimed.
from memgov import _adapters
from memgov._base import settings as _settings
from memgov._base.sizes import format_size
from memgov._cpu import threads as _threads
from memgov._gpu import nvml as _nvml
from memgov._ledger import records as _records
from memgov._profiles import store as _profiles

if TYPE_CHECKING:
    from memgov.adapter import Budget

SAMPLE_S = 1.0
"""The sampler's period: one blocking wait, then one cheap sample (torch's counters or VmHWM)."""
NVML_EVERY_MAX_S = 15.0
"""The longest wait between two NVML looks while the peak is flat (doubling from SAMPLE_S)."""
RISE = 16 * 2**20
"""A peak that grows less than this (or 1 %) since the last rise counts as flat for give back."""


class Claimed(Protocol):
    """What a run reads of its claim and asks of it (memgov._claim.Claim is one)."""

    id: str
    device: str
    bytes: int
    name: str
    mode: str
    reports: dict[str, str]

    @property
    def released(self) -> bool: ...

    def shrink(self, size: int) -> None: ...


_run: Run | None = None

ORPHAN_SAMPLES = 2
"""Samples in a row that see the run's claim released before the sampler ends the run itself."""


@dataclasses.dataclass
class Run:
    claim: Claimed
    budget: Budget
    job: str
    label: str
    sized: str
    command: str
    held: Any = None
    peak: int = 0
    measure: str = ""
    end: str = ""
    started: float = dataclasses.field(default_factory=time.monotonic)
    last_rise: float = dataclasses.field(default_factory=time.monotonic)
    given_back: bool = False
    flags: dict[str, Any] = dataclasses.field(default_factory=lambda: {"stop": False})
    """"stop": set by finish(); "finisher": the thread that ends the run. Plain assignments, no
    threading.Event: an interrupt landing inside Event.set() leaves its lock held, and the next
    set() or wait() hangs for good."""
    ended: Any = dataclasses.field(default_factory=lambda: _held_lock())
    """Held while the sampler thread runs; it releases it as it ends (it never writes the live
    file after that), and finish() waits for that with one timed acquire: no polling."""
    sampler: int | None = None
    """The sampler thread's ident."""
    wake: Any = dataclasses.field(default_factory=lambda: _held_lock())
    """Held while the run lives; the sampler sleeps by waiting for it (a timed acquire: one
    blocking wait, no polling) and finish() releases it to cut that sleep short. A raw lock,
    released in one C call: no Python-level lock can be left held by an interrupt."""
    nvml_every: float = SAMPLE_S
    nvml_next: float = 0.0
    """When NVML is next asked (time.monotonic()); 0: at the next sample."""
    torch_high: int = 0
    """torch's allocator high-water mark when NVML was last asked."""
    asked: int | None = None
    """An OOM's demand (see _asked): above the claim, the job's own allocation failed."""

    def entry(self) -> dict[str, Any]:
        """The run as its profile keeps it."""
        c = self.claim
        return {
            "peak": self.peak or None,
            "end": self.end or None,
            "time": time.time(),
            "claim": c.bytes,
            "sized": self.sized,
            "measure": self.measure or None,
            "mode": c.mode,
            "total": self.budget.device_total,
            "simulated": self.budget.simulated,
            "pid": os.getpid(),
            "asked": self.asked,
        }

    def payload(self) -> dict[str, Any]:
        """The live file: a ledger record (so _records reads it with its bounds) plus the run."""
        return {
            "version": _records.VERSION,
            "id": self.claim.id,
            "kind": "run",
            "device": self.claim.device,
            "bytes": self.claim.bytes,
            "name": self.claim.name,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "created": time.time(),
            "job": self.job,
            "label": self.label,
            "command": self.command,
            "run": self.entry(),
        }


def _held_lock() -> Any:
    lock = _thread.allocate_lock()
    lock.acquire()
    return lock


def _wake(run: Run) -> None:
    """Cut the sampler's sleep short (after setting flags["stop"]); idempotent."""
    with contextlib.suppress(RuntimeError):  # released already
        run.wake.release()


def start(claim: Claimed, budget: Budget, job: str, label: str, sized: str) -> None:
    """Begin recording this process's run of ``job`` under ``claim``; never raises."""
    global _run
    run = Run(claim, budget, job, label, sized, " ".join(_command())[:1024])
    try:
        if sized in ("given", "scheduler"):  # an auto claim read the store: folded already
            _profiles.collect()  # dead processes' runs, so the live folder stays small
        run.held = _profiles.start_live(run.payload())
    except Exception as exc:  # no store: the claim stands, the run is not recorded
        claim.reports["profile"] = f"profile: not recorded ({type(exc).__name__}: {exc})"
        return
    _run = run
    if claim.released:
        # Another thread released the claim before its run was set (its release found none
        # to end): end it now, or its live file would stay open.
        finish("released")
        return
    _install_excepthook()
    # A bare thread: threading.Thread.start() waits for the new thread to say it started, and
    # waits forever if an exception lands in that thread first (an interrupt storm meets it).
    # It holds the run weakly: a run dropped by a finish() cut short is freed, with its file.
    _threads.load_thread_unwinder()
    args = (weakref.ref(run), run.flags, run.wake, run.ended)
    run.sampler = _thread.start_new_thread(_sample_loop, args)


def current() -> Run | None:
    return _run


def finish(end: str) -> None:
    """End this process's run (``exit``, ``released``...): sample once more, fold it into the
    profile, remove the live file. A profile that cannot be written keeps the live file."""
    run = _run
    if run is not None:
        _finish(run, end)


def _finish(run: Run, end: str) -> None:
    """End ``run``, folded by the one thread that takes it first (``dict.setdefault``: one C
    call; no lock, which an exception landing between its acquire and its block would leave
    held). Another thread finding it taken leaves it alone."""
    global _run
    me = threading.get_ident()
    mine = False
    try:
        if _run is run:
            _run = None
        mine = run.flags.setdefault("finisher", me) == me
        if not mine:
            return
        run.flags["stop"] = True
        _wake(run)
        _fold(run, end)
    finally:
        if mine:
            # Whatever was raised above (Ctrl-C included), the live file's descriptor ends
            # here (closing is idempotent: never a second close of a reused number).
            run.flags["stop"] = True
            _wake(run)
            run.held.file.close()


def _end_orphan(run: Run) -> None:
    """The sampler's end of a run whose claim was released but never ended it (an interrupt
    landed in the release before the run's end began, or between taking it and the cleanup):
    folded if no one has taken it, its live file closed whatever, the sampler stopping."""
    try:
        _finish(run, "released")
    finally:
        run.flags["stop"] = True  # a finisher cut short closed nothing: closed here
        run.held.file.close()


def _fold(run: Run, end: str) -> None:
    """Fold a finished run into its profile and remove its live file; a profile that cannot
    be written keeps the live file, for the next reader (closing drops its lock)."""
    other_thread = run.sampler is not None and run.sampler != threading.get_ident()
    # Wait for the sampler's last write to the live file, then leave "ended" released.
    if other_thread and run.ended.acquire(timeout=5):
        run.ended.release()
    with contextlib.suppress(Exception):
        _sample(run)
    run.end = run.end or end
    try:
        _profiles.record(run.job, run.label, [run.entry()], run.command)
    except Exception:
        with contextlib.suppress(Exception):
            _profiles.update_live(run.held, run.payload())
        return
    finally:
        # Siblings waiting for this first run (memgov/_profiles/autosize.py) go on once its run is
        # in the profile (or, unrecordable, in its live file for the next reader to fold).
        _profiles.end_first(run.job)
    with contextlib.suppress(Exception):
        _profiles.end_live(run.held)


def _command() -> list[str]:
    return [os.path.basename(sys.executable), *sys.argv]


# -- measuring ----------------------------------------------------------------------------------


def measure(run: Run) -> tuple[int | None, str]:
    """This process's peak footprint so far, as far as one look can tell, and how it was
    measured. NVML is read now and then (see _nvml_due); torch's allocator keeps its own
    high-water mark, so where torch runs on the GPU the peak between two looks is NVML's figure
    now minus what the allocator holds now plus the most it ever held (``nvml+torch``): a spike
    between looks (cuDNN's benchmark workspaces, an evaluation batch) is not missed."""
    if run.budget.simulated:
        return _host_peak(), "host-rss"
    used = None
    before, _ = _torch_reserved()
    with contextlib.suppress(Exception):
        used = (_nvml.processes(run.claim.device) or {}).get(os.getpid())
    held, most = _torch_reserved()
    # What torch held while NVML looked: at most the larger of the two readings around it (a
    # free in between must not count twice).
    held = max(before, held)
    if used and most:
        return max(used, used - held + most), "nvml+torch"
    if used:
        return used, "nvml"
    if most:
        return most, "torch-reserved"
    return None, run.measure


def _torch_reserved() -> tuple[int, int]:
    """(bytes torch's CUDA allocator holds now, the most it ever held); zeros without CUDA.
    One read of the allocator's counters (memory_reserved() and max_memory_reserved() would
    each build the whole statistics table)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return 0, 0
    try:
        if not torch.cuda.is_initialized():
            return 0, 0
        stats = torch.cuda.memory_stats()
        return int(stats.get("reserved_bytes.all.current", 0)), int(
            stats.get("reserved_bytes.all.peak", 0)
        )
    except Exception:
        return 0, 0


def _host_peak() -> int | None:
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _sample(run: Run, now: float | None = None) -> bool:
    """Take one sample; True when the peak grew (the live file is then rewritten). ``now``
    (the sampler thread's clock): NVML is asked only when due (_nvml_due); without it (the
    last sample of a run) always."""
    if now is not None and not run.budget.simulated:
        if not _nvml_due(run, now):
            return False
        used, how = measure(run)
        _pace(run, now, used is not None and used > run.peak)
    else:
        used, how = measure(run)
    if used is None or used <= run.peak:
        return False
    if used - run.peak > max(RISE, run.peak // 100) or not _working(run):
        run.last_rise = time.monotonic()
    run.peak, run.measure = used, how
    return True


def _nvml_due(run: Run, now: float) -> bool:
    """Whether this sample asks NVML: its look is due, or torch's allocator reached a new high
    since the last look (a new peak is being made: look now)."""
    return now >= run.nvml_next or _torch_reserved()[1] > run.torch_high


def _pace(run: Run, now: float, grew: bool) -> None:
    """After an NVML look: the next one in SAMPLE_S while the peak grows, else twice the last
    wait, up to NVML_EVERY_MAX_S."""
    run.nvml_every = SAMPLE_S if grew else min(2 * run.nvml_every, NVML_EVERY_MAX_S)
    run.nvml_next = now + run.nvml_every
    run.torch_high = _torch_reserved()[1]


def _working(run: Run) -> bool:
    """Whether the job has started its GPU work, so that a flat peak means something: on a
    simulated GPU always (host memory); on a real one, once torch's cap is applied (CUDA up,
    context measured) and its allocator has held memory. Before that, a process building its
    model on the CPU looks flat at a few MiB; JAX and TensorFlow cannot lower their caps, so
    their claims never give back anyway."""
    if run.budget.simulated:
        return True
    capped = run.claim.reports.get("torch", "").startswith("torch: allocator capped")
    return capped and _torch_reserved()[1] > 0


def _sample_loop(ref: weakref.ref[Run], flags: dict[str, Any], wake: Any, ended: Any) -> None:
    released_seen = 0
    try:
        while not _stopped(flags, wake, SAMPLE_S):
            run = ref()
            if run is None:
                return  # finish() was cut short and the run freed, its file with it
            if run.claim.released:
                # A release ends its run at once (finish() stops this thread): a claim seen
                # released at two samples in a row is one whose release an interrupt cut short
                # before that. Nothing else would end the run until the next claim or exit.
                released_seen += 1
                if released_seen >= ORPHAN_SAMPLES:
                    _end_orphan(run)
                    return
                del run
                continue
            if _run is not run:
                return  # a newer run replaced this one, which goes when freed
            try:
                if _sample(run, time.monotonic()):
                    _profiles.update_live(run.held, run.payload())
                _maybe_give_back(run)
            except Exception:  # a sampler must never disturb the program
                pass
            del run  # between samples only the weak reference: see start()
    finally:
        ended.release()


def _stopped(flags: dict[str, Any], wake: Any, seconds: float) -> bool:
    """Sleep up to ``seconds``, one blocking wait that finish() cuts short (it sets "stop", then
    releases ``wake``); whether finish() asked the sampler to stop. A training loop's main
    thread meets this thread once a second, not fifty times."""
    if not flags.get("stop"):
        wake.acquire(timeout=seconds)
    return bool(flags.get("stop"))


# -- give back ----------------------------------------------------------------------------------


def _maybe_give_back(run: Run) -> None:
    if run.given_back or run.sized != "first-run" or not run.peak:
        return
    flat_s = _settings.get("MEMGOV_GIVE_BACK")
    now = time.monotonic()
    if not _working(run):
        run.last_rise = now  # the flat window starts once the GPU work has
        return
    if flat_s is None or now - run.last_rise < flat_s or now - run.started < flat_s:
        return
    run.given_back = True  # one try per run
    new = _profiles.margin(run.peak)
    if new + _profiles.MARGIN_BYTES > run.claim.bytes:
        return
    line = give_back(run, new)
    run.claim.reports["give-back"] = line
    if not _settings.get("MEMGOV_QUIET"):
        sys.stderr.write(f"memgov: {line}\n")
        sys.stderr.flush()


def give_back(run: Run, new: int) -> str:
    """Shrink the claim to ``new`` bytes: the frameworks' caps first, then the ledger record."""
    claim = run.claim
    old = claim.bytes
    if claim.mode == "hard":
        return (
            f"give back: none, {format_size(old)} stays claimed: MPS fixed this process's "
            "limit when its CUDA context was made"
        )
    smaller = dataclasses.replace(run.budget, bytes=new)
    refused = _adapters.lower(smaller, claim.reports)
    if refused:
        return f"give back: none, {format_size(old)} stays claimed: {refused}"
    claim.shrink(new)
    run.budget = smaller
    return (
        f"give back: {format_size(old)} -> {format_size(new)} = peak "
        f"{run.peak / 2**20:,.0f} MiB, flat for a while, + 10 % + 64 MiB; "
        f"{format_size(old - new)} returned to the ledger"
    )


# -- how the process ends -----------------------------------------------------------------------

OOM_NAMES = ("OutOfMemoryError", "ResourceExhaustedError", "MemoryError")


def is_oom(exc: BaseException | None) -> bool:
    """Whether an exception (or one it came from) is a framework's out-of-memory error."""
    seen = 0
    while exc is not None and seen < 8:
        name = type(exc).__name__
        if name in OOM_NAMES:
            return True
        if "RESOURCE_EXHAUSTED" in str(exc)[:4096] and "Runtime" in name:  # XLA / JAX
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False


_TRIED = r"Tried to allocate ([0-9.]+) (B|KiB|MiB|GiB|TiB)"
_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def _asked(run: Run, exc: BaseException) -> int | None:
    """What the process would have held had the allocation that failed gone through (torch's
    "Tried to allocate X": what torch holds + X + the rest of its footprint, the context, at
    its peak); None where the error does not say (a simulated GPU's MemoryError, JAX, TF)."""
    import re  # here, not with the imports: only a run that ran out of memory needs it

    found = re.search(_TRIED, str(exc)[:4096])
    if found is None:
        return None
    held, most = _torch_reserved()
    return int(float(found[1]) * _UNITS[found[2]]) + held + max(0, run.peak - most)


def _install_excepthook() -> None:
    previous = sys.excepthook
    if getattr(previous, "_memgov", False):
        return

    def hook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        run = _run
        if run is not None:
            run.end = "oom" if is_oom(value) else "error"
            if run.end == "oom":
                with contextlib.suppress(Exception):
                    run.asked = _asked(run, value)
        previous(kind, value, tb)

    hook._memgov = True  # type: ignore[attr-defined]
    sys.excepthook = hook


def _forget_in_child() -> None:
    # A forked child (DataLoader worker) is not the run: its parent records it.
    global _run
    _run = None


os.register_at_fork(after_in_child=_forget_in_child)
atexit.register(finish, "exit")
