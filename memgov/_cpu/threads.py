"""Every governed process gets its share of the CPU: the thread budget, decided and followed.

Packed jobs that each start one thread per core spin against each other until the whole host runs
slower than one job alone (docs/pack.md, "Fast by default": 8 torch jobs, 3,129 samples/s with
default threads, 50,868 with one thread each). So every governed process (auto-enable,
``memgov run``, ``memgov.claim()``, ``memgov pack``'s jobs) gets, with no variable set:

    share = usable cores (affinity, capped by the cgroup CPU quota: memgov/_cpu/cpus.py)
            / governed processes on those cores (their records: memgov/_cpu/share.py)

and the share is *followed*: a background thread re-counts the records every
:data:`FOLLOW_INTERVAL_S` and, when the share changed, has the main thread apply the new number
(torch's OpenMP thread count is per calling thread, so it must be set from the main thread: a
pending call, see :func:`_on_main_thread`). An early starter gives cores back within a second of
others arriving, and the last one left gets all cores back. A share starts no higher than the
cores free at that instant and grows only into cores that were idle (memgov/_cpu/load.py): jobs
launched together all look alone to the first of them. Each second costs one stat of the
records' folder: the records are read again only when it changed (a process arrived, left or
changed its share) or :data:`RESCAN_S` passed (a process killed by a signal leaves its file, whose
lock died with it: its cores come back within that time).

What each runtime honours (docs/threads.md has the measurements):
- OpenMP/MKL/OpenBLAS/numexpr read their variables when their library loads: set here before any
  framework import where memgov can, and inherited by children;
- torch: ``set_num_threads`` (followed) and ``set_num_interop_threads`` (once: fixed after first
  use); TensorFlow: intra/inter-op (once, before its runtime starts);
- XLA (JAX) sizes its CPU pools from the affinity mask only (no flag bounds them): memgov leaves
  affinity alone (``memgov pack --pin`` sets it).

The user's own settings win: ``MEMGOV_THREADS=N`` (fixed N), an ``OMP_NUM_THREADS`` (or MKL/
OpenBLAS variable) the user set, ``torch.set_num_threads`` called before the claim or at any time
after it (the follower stops then). ``MEMGOV_THREADS=off`` turns all of this off.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from memgov._base import settings as _settings
from memgov._base.errors import ConfigError, LedgerError
from memgov._cpu import cpus as _cpus, load as _cpuload, share as _cpushare

ENV_VARS = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)
"""Read by OpenMP, MKL, OpenBLAS, Accelerate and numexpr when they load; children inherit them."""
MARK_ENV = "MEMGOV_THREADS_SET"
"""The value memgov itself wrote into ENV_VARS: a child that inherits them knows they are
memgov's (a share to re-decide), not the user's (a choice to keep)."""
SETTING_ENV = "MEMGOV_THREADS"
FOLLOW_INTERVAL_S = 1.0
"""How often a governed process looks whether its neighbours changed (one stat of their folder)."""
GROW_WITHIN_S = 10.0
"""The longest a share stands above a process's threads, waiting for idle cores, before the
process grows to it anyway (memgov/_cpu/load.py): busy cores make it wait out a burst of starts
or a tail of exits, never keep it below its share for good."""
RESCAN_S = 8.0
"""The longest time between two readings of the records while their folder looks unchanged
(reading 25 records costs 2.4-2.7 ms of CPU, holding the interpreter's lock against the training
loop: results/cpu-2core/2026-11-24-governed-idle-cost.txt)."""

Setting = _settings.Threads
"""MEMGOV_THREADS, parsed (by memgov/_base/settings.py)."""


def setting() -> Setting:
    """MEMGOV_THREADS; raises ConfigError naming the variable and what it accepts."""
    chosen: Setting = _settings.get(SETTING_ENV)
    return chosen


def user_env() -> tuple[str, int] | None:
    """The first thread variable the user set themselves (not memgov's inherited value)."""
    mark = os.environ.get(MARK_ENV, "").strip()
    for name in ENV_VARS:
        value = os.environ.get(name, "").strip()
        if value and value != mark:
            return (name, int(value)) if value.isdigit() and int(value) > 0 else (name, 0)
    return None


@dataclass
class Budget:
    """What this process's threads are, and why (``memgov doctor`` prints ``why``)."""

    threads: int | None
    """Threads to apply now; None: memgov leaves the thread pools alone."""
    source: str
    """share | once | MEMGOV_THREADS | user | off | inherited"""
    why: str
    follow: bool = False
    record: str | None = None
    history: list[str] = field(default_factory=list)


_lock = threading.RLock()
_state: dict[str, object] = {}
Follower = Callable[[int], "tuple[int, str] | None"]
"""Applies a new share on the main thread; returns None, or (threads, why) when the user has
set the framework's threads themselves (following stops then)."""
_callbacks: list[Follower] = []


def current() -> Budget | None:
    """This process's thread budget, once decided."""
    budget = _state.get("budget")
    return budget if isinstance(budget, Budget) else None


def govern(chosen: Setting, holder: str = "", inherited: bool = False) -> Budget:
    """Decide this process's threads (``chosen``: MEMGOV_THREADS, parsed by the caller before
    admission), register it among the governed, set the thread variables and start following
    the share. Idempotent: a second claim in one process reuses the first decision, made
    before it by auto-enable as the framework's import began (memgov/_autoenable.py); the
    record then names the claim (``holder``), which ``memgov status`` shows."""
    with _lock:
        done = current()
        if done is not None:
            _name_holder(holder)
            return done
        _state["preloaded"] = frameworks_loaded()
        budget = _decide(chosen, holder, inherited)
        _state["budget"] = budget
    if budget.follow:
        _start_follower()
    return budget


def _decide(chosen: Setting, holder: str, inherited: bool) -> Budget:
    if chosen.mode == "off":
        return Budget(None, "off", "MEMGOV_THREADS=off: memgov leaves thread pools alone")
    usable = _cpus.usable()
    mark = os.environ.get(MARK_ENV, "").strip()
    if inherited:
        # A child of a governed process (DataLoader worker, subprocess): its parent's record
        # counts the job; it keeps the threads its parent's environment gives it.
        value = int(mark) if mark.isdigit() else None
        why = f"inherited from the governed parent ({mark or 'no'} thread variable)"
        return Budget(value, "inherited", why)
    user = user_env()
    fixed = chosen.count if chosen.mode == "fixed" else None
    if fixed is None and user is not None:
        name, value = user
        why = f"{name}={os.environ[name]} set by the user: memgov leaves thread pools alone"
        reg = _register(usable, value or None, "user", holder, why)
        return Budget(None, "user", why, record=reg.name if reg else None)
    if fixed is not None:
        why = f"MEMGOV_THREADS={fixed}"
        reg = _register(usable, fixed, "MEMGOV_THREADS", holder, why)
        _set_env(fixed)
        return Budget(fixed, "MEMGOV_THREADS", why, record=reg.name if reg else None)
    reg = _register(usable, None, chosen.mode, holder)
    mine = reg.name if reg else None
    live = _cpushare.peers(root=reg.root) if reg else []
    part = _cpushare.share(usable, live, mine)
    follow = chosen.mode == "auto" and reg is not None
    why = f"share: {usable.describe()}; {part.describe(usable)} -> {part.threads}"
    threads = part.threads
    if follow:  # a followed share starts no higher than the cores free now, and grows into idle
        threads, busy = _start_within_free_cores(usable, part.threads)
        why += busy
    if chosen.mode == "once":
        why += " (MEMGOV_THREADS=once: not followed)"
    _set_env(threads)
    if reg is not None:
        with contextlib.suppress(OSError, LedgerError):  # the count stands even so
            reg.update(threads=threads, why=why)
    budget = Budget(threads, "share" if follow else "once", why, follow, mine)
    budget.history.append(f"{threads} at start ({part.neighbours} on the cores)")
    _state["fair"], _state["neighbours"] = part.threads, part.neighbours
    return budget


def _start_within_free_cores(usable: _cpus.Usable, fair: int) -> tuple[int, str]:
    """The first threads of a followed share: at most the cores not running anything else now
    (jobs launched together register one by one while all of them are busy starting), and why
    when that is fewer than the share. The follower grows it as cores go idle."""
    others = _cpuload.runnable_elsewhere(usable.cpus)
    if others is None or fair <= 1:
        return fair, ""
    free = max(1, usable.count - others)
    if free >= fair:
        return fair, ""
    return free, (
        f"; {others} thread(s) runnable elsewhere on the host now: {free} to start with, "
        "more as cores go idle"
    )


def _register(
    usable: _cpus.Usable, threads: int | None, source: str, holder: str, why: str = ""
) -> _cpushare.Registration | None:
    try:
        reg = _cpushare.register(usable, threads, source, holder, why)
    except (OSError, LedgerError) as exc:
        # No shared folder: the process still gets a thread budget, as if alone.
        _state["register_error"] = f"{type(exc).__name__}: {exc}"
        return None
    _state["registration"] = reg
    return reg


def _name_holder(holder: str) -> None:
    """The claim ``holder`` into this process's record, where it names another or none."""
    reg = _state.get("registration")
    if not holder or not isinstance(reg, _cpushare.Registration):
        return
    if reg.payload.get("holder") == holder:
        return
    with contextlib.suppress(OSError, LedgerError):  # a detail of `memgov status`: never fail
        reg.update(holder=holder)


def _set_env(threads: int) -> None:
    for name in ENV_VARS:
        os.environ[name] = str(threads)
    os.environ[MARK_ENV] = str(threads)


def report(budget: Budget) -> str | None:
    """The one-line report a claim shows, or None when memgov leaves threads alone."""
    if budget.threads is None:
        return f"threads: {budget.why}" if budget.source == "user" else None
    follow = ", followed as governed processes come and go" if budget.follow else ""
    return f"{budget.threads} CPU thread(s) ({budget.why}{follow})"


def on_change(callback: Follower) -> None:
    """Run ``callback(threads)`` on the main thread whenever the followed share changes."""
    with _lock:
        _callbacks.append(callback)


def now(default: int | None) -> int | None:
    """The thread count to apply now (the share may have moved since the claim)."""
    budget = current()
    return budget.threads if budget is not None and budget.threads else default


def explain() -> dict[str, object]:
    """What a governed process started here would get, and why (``memgov doctor``); reads only."""
    info: dict[str, object] = {"MEMGOV_THREADS": os.environ.get(SETTING_ENV)}
    try:
        chosen = setting()
    except ConfigError as exc:
        info["decision"] = f"{exc} (auto mode warns and governs nothing; strict mode fails)"
        return info
    usable = _cpus.usable()
    info["usable"] = {
        "cores": sorted(usable.cpus),
        "quota": None
        if usable.quota is None
        else {"cpus": usable.quota.cpus, "source": usable.quota.source},
        "count": usable.count,
    }
    try:
        live = _cpushare.peers(clean=False)
    except (OSError, LedgerError) as exc:
        live = []
        info["ledger_problem"] = f"{type(exc).__name__}: {exc}"
    info["governed"] = [
        {
            "pid": p.pid,
            "host": p.host,
            "threads": p.threads,
            "source": p.source,
            "why": p.why,
            "claim": p.holder or None,
        }
        for p in live
    ]
    part = _cpushare.share(usable, live, None)
    user = user_env()
    if chosen.mode == "off":
        info["decision"] = "MEMGOV_THREADS=off: memgov leaves thread pools alone"
    elif chosen.mode == "fixed":
        info["decision"] = f"MEMGOV_THREADS={chosen.count}: {chosen.count} thread(s), fixed"
    elif user is not None:
        info["decision"] = f"{user[0]}={os.environ[user[0]]} set by the user: left alone"
    else:
        follow = "followed" if chosen.mode == "auto" else "computed once (MEMGOV_THREADS=once)"
        info["decision"] = (
            f"{part.threads} thread(s) for a governed process started now: {usable.describe()}; "
            f"{part.describe(usable)} (this one included); {follow}"
        )
    return info


# -- following ----------------------------------------------------------------------------------


def load_thread_unwinder() -> None:
    """Load libgcc_s now, before memgov starts a thread. glibc loads it at a process's first
    pthread_exit, which a daemon thread meets when it wakes while the interpreter finalizes; a
    program ending out of memory (a tight RLIMIT_AS, address space used up) then aborts with
    "libgcc_s.so.1 must be installed for pthread_exit to work" instead of exiting with its
    MemoryError. Nowhere to load it from (musl, no such file): nothing to do."""
    if _state.get("unwinder") is not None:
        return
    import ctypes  # here, not at import: `import memgov` stays cheap

    try:
        _state["unwinder"] = ctypes.CDLL("libgcc_s.so.1")
    except OSError:
        _state["unwinder"] = False


def _start_follower() -> None:
    load_thread_unwinder()
    with _lock:
        if _state.get("follower") is not None:
            return
        stop = threading.Event()
        thread = threading.Thread(target=_follow, args=(stop,), name="memgov-threads", daemon=True)
        _state["follower"] = (thread, stop)
    thread.start()


def stop_following() -> None:
    with _lock:
        found = _state.pop("follower", None)
    if isinstance(found, tuple):
        found[1].set()


def _follow(stop: threading.Event) -> None:
    seen: object = None
    scanned = time.monotonic()
    usable = _cpus.usable()
    growth = _Growth(_cpuload.IdleMeter(usable.cpus))
    described = ""
    while not stop.wait(FOLLOW_INTERVAL_S):
        budget = current()
        reg = _state.get("registration")
        if budget is None or not budget.follow or not isinstance(reg, _cpushare.Registration):
            return
        # Stamped before reading: a change made while the records are read is seen next time.
        stamp = _folder_stamp(reg.root)
        if stamp != seen or time.monotonic() - scanned >= RESCAN_S:
            seen, scanned = stamp, time.monotonic()
            try:
                usable = _cpus.usable()
                part = _cpushare.share(usable, _cpushare.peers(root=reg.root), reg.name)
            except Exception:  # a transient filesystem problem: keep the current share
                continue
            _state["fair"], _state["neighbours"] = part.threads, part.neighbours
            described = f"{part.describe(usable)}, followed"
            if growth.meter.cpus != usable.cpus:
                growth = _Growth(_cpuload.IdleMeter(usable.cpus))
        # Against the last share decided, not budget.threads: that changes only once the main
        # thread has applied it, and a record rewritten every second until then (or for good,
        # in a process with no framework to apply it to) makes every neighbour read them all.
        wanted = _state.get("wanted", budget.threads)
        fair = _state.get("fair", wanted)
        if not isinstance(wanted, int) or not isinstance(fair, int):
            continue
        neighbours = _state.get("neighbours", 1)
        if not isinstance(neighbours, int):
            neighbours = 1
        target = growth.target(wanted, fair, time.monotonic(), neighbours)
        if target == wanted:
            continue
        with contextlib.suppress(Exception):
            reg.update(threads=target, why=f"share: {described or 'followed'}")
        _set_env(target)
        _state["wanted"] = target
        budget.history.append(f"{target} (share {fair}; {described or 'followed'})")
        del budget.history[:-20]
        with _lock:
            on_main = bool(_callbacks)
        if on_main:
            _schedule_main()
        else:  # no framework's threads to set: the budget is the share now
            budget.threads = target


@dataclass
class _Growth:
    """How far a followed share may go now: down at once; up only into this process's part of
    the cores that were idle over the follower's last interval (split among the governed
    processes on those cores: each of them sees the same idle cores), and all the way once it
    has waited GROW_WITHIN_S."""

    meter: _cpuload.IdleMeter
    since: float | None = None
    """When the share first stood above the process's threads (None: it does not)."""

    def target(self, wanted: int, fair: int, now: float, neighbours: int = 1) -> int:
        if fair <= wanted:
            self.meter.forget()
            self.since = None
            return fair
        if self.since is None:
            self.since = now
        if now - self.since >= GROW_WITHIN_S:
            return fair
        idle = self.meter.idle_cores()
        if idle is None:  # the interval starts now; nothing to measure with: the share alone
            return wanted if self.meter.readable else fair
        # Every neighbour growing by all the idle cores at once would oversubscribe them: in
        # the tail of 25 public MNIST jobs, each with a busy DataLoader worker that no share
        # counts, that made the last epochs slower than one thread each (docs/threads.md).
        return min(fair, wanted + int(idle / max(1, neighbours)))


def _folder_stamp(root: Path) -> tuple[int, int, int] | None:
    """The records' folder as stat sees it (identity and times: a record made, replaced or
    removed changes them); None when it cannot be read (then it is read every RESCAN_S)."""
    try:
        info = os.stat(root.joinpath(*_cpushare.PARTS), follow_symlinks=False)
    except OSError:
        return None
    return info.st_ino, info.st_mtime_ns, info.st_ctime_ns


def _schedule_main() -> None:
    """Run :func:`_apply_wanted` on the main thread at its next bytecode (like a signal handler,
    without a signal): OpenMP's thread count is a per-thread setting, and the training loop runs
    on the main thread."""
    with _lock:
        if _state.get("scheduled") or not _callbacks:
            return
        _state["scheduled"] = True
    import ctypes  # here, not at import: `import memgov` stays cheap

    kind = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
    callback = _state.get("pending_cb")
    if callback is None:
        callback = _state["pending_cb"] = kind(_on_main_thread)  # kept alive: C holds it
    add = ctypes.pythonapi.Py_AddPendingCall
    add.argtypes = [kind, ctypes.c_void_p]
    add.restype = ctypes.c_int
    if add(callback, None) != 0:  # the queue is full: try again at the next change
        _state["scheduled"] = False


def _on_main_thread(_arg: object) -> int:
    try:
        _state["scheduled"] = False
        _apply_wanted()
    except BaseException:  # an exception here would surface in the user's code: never
        pass
    return 0


def _apply_wanted() -> None:
    wanted = _state.get("wanted")
    budget = current()
    if not isinstance(wanted, int) or budget is None or not budget.follow:
        return
    with _lock:
        callbacks = list(_callbacks)
    taken: tuple[int, str] | None = None
    for callback in callbacks:
        try:
            taken = callback(wanted) or taken
        except Exception:
            continue
    budget.threads = wanted
    if taken is None:
        return
    # The user set the framework's threads: theirs from now on, and neighbours see it.
    budget.follow, budget.threads, budget.source = False, taken[0], "user"
    budget.why = f"{taken[1]}: memgov follows the share no more"
    budget.history.append(f"{taken[0]} set by the user")
    reg = _state.get("registration")
    if isinstance(reg, _cpushare.Registration):
        with contextlib.suppress(Exception):
            reg.update(threads=taken[0], source="user", why=budget.why)


def _forget_in_child() -> None:
    # A forked child (DataLoader worker, Pool worker) is covered by its parent's record. Its copy
    # of the record's descriptor is closed by _flock's at-fork hook, like every ledger file, so
    # the lock dies with the parent; nothing here touches it. What stays is the Registration
    # object: dropped, so the child can never update or remove (unlink) the parent's record,
    # neither at exit nor by following a share (the follower thread did not survive the fork).
    global _lock
    _lock = threading.RLock()  # the follower may have held the old one at the fork: never freed
    for key in ("registration", "follower", "budget", "wanted", "fair", "neighbours"):
        _state.pop(key, None)
    # "pending_cb" stays: a call the follower queued just before the fork may still run here.
    _state["scheduled"] = False
    _callbacks.clear()


def _release_at_exit() -> None:
    # At interpreter exit, before the frameworks' own teardown (seconds for torch on a busy
    # host): the neighbours get this process's cores back now, not when its last fd closes.
    stop_following()
    reg = _state.pop("registration", None)
    if isinstance(reg, _cpushare.Registration):
        reg.close()


os.register_at_fork(after_in_child=_forget_in_child)
atexit.register(_release_at_exit)


def preloaded() -> list[str]:
    """Frameworks imported before the thread budget was decided (the user may have set their
    threads already)."""
    found = _state.get("preloaded")
    return list(found) if isinstance(found, list) else []


def frameworks_loaded() -> list[str]:
    """The frameworks imported already (one whose import has just begun, as when auto-enable
    decides the share, is not: its code, and its libraries' thread pools, are still to come)."""
    from memgov._base import importhook as _importhook

    return [name for name in _importhook.frameworks() if _importhook.imported(name)]
