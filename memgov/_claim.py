"""memgov.claim(): reserve a GPU memory budget for this process; make its frameworks keep to it."""

from __future__ import annotations

import atexit
import contextlib
import functools
import itertools
import os
import sys
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, NamedTuple

# Imported here, not where used: a lazy import opens a file, and a claim must work with the
# process's descriptors spent (tests/hostile/test_users.py); and an import holds that module's
# import lock, which a child forked meanwhile by another thread inherits held for good: its own
# claim would wait for it forever (tests/hostile/test_forks.py). Nothing claim() runs imports.
from memgov import _adapters, _runs
from memgov._base import settings as _settings, signals as _signals
from memgov._base.errors import ConfigError, MemgovError
from memgov._base.sizes import Size, format_size
from memgov._cpu import threads as _threads
from memgov._gpu import devices as _devices, enforce as _enforce
from memgov._ledger import admission as _admission
from memgov._ledger.ledger import DeviceLedger
from memgov._ledger.records import Held
from memgov._profiles import autosize as _autosize, jobid as _jobid

AUTO_ACCEPTED = (
    "'auto' (a GPU scheduler's budget, else the job's measured profile, else a first-run share "
    "of what is free; docs/profiles.md)"
)
"""What else claim()'s size accepts, said in a bad size's error."""

HOLDER_ENV = "MEMGOV_HOLDER"
"""Set while this process holds a claim (``<device uuid>/<record>``); children inherit it."""

_current: Claim | None = None
"""Set and cleared by single assignments: no lock, because a lock can be left held by an
exception that lands between its acquire and its block (an async exception, a signal handler's)."""


class _Attempt:
    """Marks a claim() in progress; only a weak reference is kept, so the mark ends with the
    attempt's frame even when an exception cuts short the code that would clear it."""


_claiming: dict[int, tuple[weakref.ref[_Attempt], int]] = {}
"""The claim() calls in progress in this process: a weak reference to each attempt and its
thread, by a number of its own. Each entry goes when its attempt ends: the weak reference's
callback is ``dict.pop`` bound to its key, C calls only. A Python callback can be entered by
Ctrl-C, which Python then prints as "Exception ignored" and drops: the user's interrupt lost
(1% of random interrupts did)."""
_keys = itertools.count()
"""Keys of _claiming: next() on it is one C call, so two threads never get the same one."""


@dataclass
class Claim:
    """A budget held on one GPU until released or until the process ends, however it ends."""

    bytes: int
    device: str
    """The GPU's UUID (indices differ between containers; UUIDs do not)."""
    name: str
    mode: str
    """"hard" when the GPU driver enforces the budget (MPS), else "soft" (framework caps)."""
    index: int | None
    """The GPU's index in this process's frameworks (cuda:N); None for simulated devices."""
    id: str
    record: str
    reports: dict[str, str] = field(default_factory=dict)
    """Adapter name -> what it applied (filled in as frameworks are imported)."""
    mode_reason: str = ""
    """Why the claim is soft (e.g. CUDA already initialised), or which MPS daemon makes it hard."""
    compute: int | None = None
    """Percent of the GPU's SMs asked for with ``compute=``; applied in hard mode only."""
    admission_s: float = 0.0
    """Seconds from the request to the written record (``reports["admission"]`` says where)."""
    job: str = ""
    """The job whose profile this process's run goes into (memgov/_profiles/jobid.py)."""
    sized: str = "given"
    """Where the size came from: given, scheduler, profile or first-run (``auto``)."""
    _ledger: DeviceLedger | None = field(default=None, repr=False)
    _held: Held | None = field(default=None, repr=False)
    _restore: dict[str, str | None] = field(default_factory=dict, repr=False)
    _payload: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def released(self) -> bool:
        return self._held is None

    def shrink(self, size: int) -> None:
        """Hold ``size`` bytes from now on (less than now: the rest returns to the ledger). The
        record is rewritten under the device's admission lock; its flock never drops."""
        held, ledger = self._held, self._ledger
        if held is None or ledger is None or size >= self.bytes:
            return
        payload = {**self._payload, "bytes": size, "given_back": self.bytes - size}
        before = held.file
        try:
            with _signals.deferred(), ledger.locked():
                ledger.update("claims", held, payload)
        finally:
            if held.file is not before:  # the record is the new one, interrupted or not
                self._payload, self.bytes = payload, size

    def release(self) -> None:
        """Give the budget back. Frameworks cannot lift a cap once set, so release at the end."""
        with _signals.deferred():  # a signal's handler runs once the budget is back
            self._release()

    def _release(self) -> None:
        global _current
        held, ledger = self._held, self._ledger
        try:
            self._held = None
            restore, self._restore = self._restore, {}
            if _current is self:
                _current = None
                os.environ.pop(HOLDER_ENV, None)
            _enforce.restore(restore)  # a child started from now on gets no stale MPS limit
            _adapters.release()  # the frameworks' views show the device's own figures again
        finally:
            # Whatever was raised above (Ctrl-C included), the lock is dropped: remove() closes
            # the record's file last, and a file it never reached is closed when collected.
            if held is not None and ledger is not None:
                ledger.remove("claims", held)
        if held is not None:
            # The budget is back first: folding the run into its profile (a last sample, a
            # durable write) is this process's bookkeeping, and every claim queued behind this
            # one would wait for it (a write's fsync waits for another user's flood of files).
            _end_run(self)

    def __enter__(self) -> Claim:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __str__(self) -> str:
        where = f"cuda:{self.index}" if self.index is not None else "simulated"
        state = "released" if self.released else self.mode
        return f"claim {self.name!r}: {format_size(self.bytes)} on {self.device} ({where}, {state})"


def current() -> Claim | None:
    """The claim this process holds, if any."""
    return _current


def claim(
    size: int | str | Size,
    *,
    device: int | str | None = None,
    wait: float | None = None,
    name: str | None = None,
    compute: int | None = None,
    job: str | None = None,
) -> Claim:
    """Reserve ``size`` of GPU memory for this process and cap its frameworks to it.

    ``size``: bytes, "2GiB", "512MiB", "2G" (binary), "2GB" (decimal), "25%" of the device, or
    "auto": a GPU scheduler's budget, else the job's measured profile, else a first-run share
    of the free budget (docs/profiles.md); an auto claim prints where its size came from.
    ``job``: the name this process's run is recorded under (default: MEMGOV_JOB, else derived
    from the command, memgov/_profiles/jobid.py); its profile sizes later ``auto`` claims.
    ``device``: None (first visible GPU), an index (cuda:N), a GPU UUID, or "auto" (most free).
    ``wait``: None fails at once; seconds queue first-come-first-served for that long.
    ``compute``: percent of the GPU's SMs (1-100) this process may use; needs hard mode.
    The claim is hard (driver-enforced through MPS, see docs/hard-limits.md) when an MPS daemon
    is reachable and CUDA is not yet initialised in this process, else soft; ``Claim.mode`` and
    ``Claim.mode_reason`` say which and why.
    Raises BudgetExceeded when the budget does not fit, ConfigError (a ValueError too) for bad
    arguments, saying what is accepted (memgov's errors: README.md, "Errors").
    """
    auto = isinstance(size, str) and size.strip().lower() == "auto"
    # A Size from a setting keeps its variable's name.
    request = _autosize.AUTO if auto else Size.of(size, "claim size", also=AUTO_ACCEPTED)
    wait_s = _settings.wait_seconds(wait, "wait")
    job_name, job_label = _jobid.job_for(job)
    # A job named by its runner (job=, MEMGOV_JOB: `memgov run --job`, the queue's jobs) names
    # its claims too; a derived name (label-hash) does not: its program's name is as clear.
    label = _check_name(name, job_name if job_name == job_label else None)
    chosen_threads = _threads.setting()  # checked before admission: an error must hold nothing
    compute_pct = _enforce.check_compute(compute)
    attempt = _start_attempt()
    made: list[tuple[Claim, dict[str, str | None]]] = []
    try:
        # A signal's handler runs once the claim is made or undone, never between two of its
        # statements (the wait for a place in the queue excepted: memgov/_base/signals.py).
        with _signals.deferred():
            try:
                result, touched, chosen = _claim_now(
                    request, device, wait_s, label, compute_pct, (job_name, job_label)
                )
            finally:
                del attempt  # ends the mark (the weak reference dies with it)
            made.append((result, touched))
            budget = _govern_or_release(result, chosen, chosen_threads, label, touched)
            _runs.start(result, budget, job_name, job_label, result.sized)
    except BaseException:
        # What the handler raised as the claim was done (Ctrl-C during it): undone, as any
        # failed claim() is.
        with _signals.deferred():
            for result, touched in made:
                _undo(result, touched)
        raise
    if auto and "auto" in result.reports and not _settings.quiet():
        sys.stderr.write(f"memgov: {result.reports['auto']}\n")
        sys.stderr.flush()
    return result


def _start_attempt() -> _Attempt:
    """Mark this thread's claim() in progress (the mark ends with the returned object); refused
    while this process holds a claim or another of its threads is claiming."""
    if _current is not None:
        # One claim per process: a holder that waits for more could deadlock with another.
        raise MemgovError(
            f"this process already holds {_current}; release it before claiming again"
        )
    attempt = _Attempt()
    key, me = next(_keys), threading.get_ident()
    try:
        _claiming[key] = (weakref.ref(attempt, functools.partial(_claiming.pop, key)), me)
        # Entered first, then looked: of two threads that overlap here, the later to enter
        # sees the other (both may step back; neither goes on beside the other). This thread's
        # own earlier entries are over whatever keeps them alive (a traceback an interrupt
        # left, which a notebook keeps in sys.last_traceback): this thread is here now.
        if any(
            k != key and thread != me and mark() is not None
            for k, (mark, thread) in list(_claiming.items())
        ):
            # Not waited for: this thread's own wait (None: fail at once) must not be spent
            # behind another thread's.
            raise MemgovError(
                "another thread of this process is claiming right now; a process holds at "
                "most one claim, so claim in one thread (or in separate processes)"
            )
    except BaseException:
        _claiming.pop(key, None)
        raise
    return attempt


def _govern_or_release(
    result: Claim,
    chosen: _devices.Device,
    chosen_threads: _threads.Setting,
    label: str,
    touched: dict[str, str | None],
) -> _adapters.Budget:
    """:func:`_govern`; where it fails, the claim is undone before the exception propagates: a
    failed claim() holds nothing."""
    try:
        return _govern(result, chosen, chosen_threads, label)
    except BaseException:
        _undo(result, touched)
        raise


def _undo(result: Claim, touched: dict[str, str | None]) -> None:
    """Release a claim that claim() will not return, and put back the environment ``touched``."""
    try:
        result.release()
    finally:
        _enforce.restore(touched)


def _govern(
    result: Claim, chosen: _devices.Device, chosen_threads: _threads.Setting, label: str
) -> _adapters.Budget:
    """Give the admitted claim its CPU threads and its frameworks' caps; the budget applied."""
    threads = _threads.govern(chosen_threads, holder=f"{chosen.uuid}/{result.record}")
    if _threads.report(threads):
        result.reports["threads"] = str(_threads.report(threads))
    budget = _adapters.Budget(
        bytes=result.bytes,
        device_uuid=chosen.uuid,
        device_total=chosen.total,
        device_index=result.index,
        simulated=chosen.simulated,
        name=label,
        threads=threads.threads,
        hard=result.mode == "hard",
    )
    _adapters.govern(budget, result.reports)
    return budget


def _end_run(claim: Claim) -> None:
    """The claim ends before the process: its run ends now (memgov/_runs.py)."""
    run = _runs.current()
    if run is not None and run.claim is claim:
        with contextlib.suppress(Exception):  # a sizing aid: never fail a release for it
            _runs.finish("released")


class _Sizing(NamedTuple):
    """The devices a claim may take and what it asks on each."""

    candidates: list[_devices.Device]
    sizes: dict[str, int]
    """Bytes per device UUID."""
    kinds: dict[str, str]
    """Where each size came from, per device UUID: given, or auto's scheduler/profile/first-run."""
    lines: dict[str, str]
    """auto's report line per device UUID (none for a given size)."""


def _sizing(size: Size | str, device: int | str | None, job: tuple[str, str]) -> _Sizing:
    candidates = _devices.candidates(device)
    if isinstance(size, Size):
        sizes = _devices.sizes_on(size, candidates)  # ConfigError when no device can hold it
        kinds, lines = dict.fromkeys(sizes, "given"), {}
    else:
        auto = {d.uuid: _autosize.size_for(d, *job, sibling=True) for d in candidates}
        sizes = {uuid: sized.bytes for uuid, sized in auto.items()}
        kinds = {uuid: sized.kind for uuid, sized in auto.items()}
        lines = {uuid: sized.line for uuid, sized in auto.items()}
    return _Sizing([d for d in candidates if d.uuid in sizes], sizes, kinds, lines)


def _claim_now(
    size: Size | str,
    device: int | str | None,
    wait_s: float | None,
    label: str,
    compute_pct: int | None,
    job: tuple[str, str],
) -> tuple[Claim, dict[str, str | None], _devices.Device]:
    global _current
    sizing = _sizing(size, device, job)
    # The mode goes into the record, so it is decided before admission writes one.
    plan = _enforce.decide(sizing.candidates, _adapters.any_cuda_initialized())
    admitted = _admission.admit(
        [DeviceLedger(d) for d in sizing.candidates],
        _admission.Request(
            sizes=sizing.sizes,
            name=label,
            wait_s=wait_s,
            modes={d.uuid: plan.mode(d, compute_pct) for d in sizing.candidates},
            compute=compute_pct,
            daemons=plan.daemons,
            info={uuid: {"job": job[0], "sized": kind} for uuid, kind in sizing.kinds.items()},
        ),
    )
    ledger, held, chosen = admitted.ledger, admitted.held, admitted.ledger.device
    # Everything from here to the return can still fail (an adapter's configure_env, the
    # environment, Ctrl-C): the record is then released and the environment put back before
    # the exception propagates, so a failed claim() holds nothing.
    touched = {n: os.environ.get(n) for n in ("CUDA_VISIBLE_DEVICES", *_enforce.CLAIM_ENV)}
    try:
        result = _settle(admitted, plan, label, compute_pct)
        result.job, result.sized = job[0], sizing.kinds[chosen.uuid]
        if chosen.uuid in sizing.lines:
            result.reports["auto"] = sizing.lines[chosen.uuid]
        result.admission_s = admitted.timing.seconds()
        result.reports["admission"] = admitted.timing.report()
        _current = result
        os.environ[HOLDER_ENV] = f"{chosen.uuid}/{held.name}"
    except BaseException:
        try:
            if _current is not None and _current._held is held:
                _current = None
                os.environ.pop(HOLDER_ENV, None)
            _enforce.restore(touched)
        finally:
            ledger.remove("claims", held)
        raise
    return result, touched, chosen


def _settle(
    admitted: _admission.Admitted, plan: _enforce.Plan, label: str, compute_pct: int | None
) -> Claim:
    """Pin this process to the admitted GPU, apply hard mode's limit; the Claim to return."""
    chosen = admitted.ledger.device
    index = None if chosen.simulated else chosen.visible_index
    if not chosen.simulated and not _adapters.any_cuda_initialized():
        # Pin the frameworks to the claimed GPU: it becomes their cuda:0 (an inherited MPS
        # pinned limit is renumbered to match).
        _enforce.renumber_pinned(index)
        os.environ["CUDA_VISIBLE_DEVICES"] = chosen.uuid
        index = 0
    restore: dict[str, str | None] = {}
    if admitted.mode == "hard":
        restore = _enforce.apply(plan, admitted.bytes, index or 0, compute_pct, admitted.mps_daemon)
    result = Claim(
        bytes=admitted.bytes,
        device=chosen.uuid,
        name=label,
        mode=admitted.mode,
        index=index,
        id=admitted.id,
        record=admitted.held.name,
        mode_reason=admitted.mode_reason,
        compute=compute_pct,
        _ledger=admitted.ledger,
        _held=admitted.held,
        _restore=restore,
        _payload=admitted.record,
    )
    if restore:
        result.reports["mps"] = _enforce.describe()
    return result


def _check_name(name: object, job: str | None = None) -> str:
    if name is None and job is not None:
        return f"{job[:100]}:{os.getpid()}"
    if name is None:
        program = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
        return f"{program or 'python'}:{os.getpid()}"
    if not isinstance(name, str) or not name.strip() or len(name) > 128 or not name.isprintable():
        raise ConfigError(f"name={name!r}: accepted a printable string of 1 to 128 characters")
    return name


def _forget_in_child() -> None:
    # A forked child must not keep the parent's record lock alive after the parent dies; the
    # descriptor itself is closed by _flock's at-fork hook (every ledger file is).
    global _current
    if _current is not None:
        # Detach the child's copy too: its release() (a `with` block it unwinds) must not unlink
        # the parent's record.
        _current._held = _current._ledger = None
    _current = None
    _claiming.clear()  # a claim another thread was making stays the parent's


def _release_at_exit() -> None:
    # The run ends as "exit" before the claim's release would end it as "released": stated
    # here, not left to the order of atexit's registrations.
    _runs.finish("exit")
    claim_now = _current
    if claim_now is not None:
        claim_now.release()


os.register_at_fork(after_in_child=_forget_in_child)
atexit.register(_release_at_exit)
