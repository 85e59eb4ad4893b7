"""Admission: wait for (or refuse) room on a device, under its lock, and write the claim record.

``claim()`` (memgov/_claim.py) decides what to ask for (a :class:`Request`: sizes per device,
modes, MPS daemons) and settles what it got (an :class:`Admitted`); this module does the one
read-modify-write of the ledger that a claim is: NVML read before the device's lock (_ledger),
then under it the scan, the decision and the record (:func:`_look`). Waiters hold a ticket in the
device's queue and only the first of them takes the lock, woken by removals in the device's
folders (_wake; :class:`_Queue`).

The steps: :func:`admit` -> :func:`_admit_now` (no wait: most free device first, refused at
once) or :func:`_admit_waiting` (:func:`_fitting` devices, then :class:`_Queue`: join, look,
sleep, until admitted or :meth:`_Queue.timed_out`; its tickets go however it ends).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from memgov._base import config as _config, signals as _signals
from memgov._base.errors import BudgetExceeded, LockTimeout
from memgov._base.sizes import format_size
from memgov._gpu import devices as _devices, enforce as _enforce
from memgov._ledger import deadnames as _deadnames, stats as _stats
from memgov._ledger.ledger import (
    STOPPED_WAITER_S,
    DeviceLedger,
    QueuePlace,
    Snapshot,
    record_payload,
)
from memgov._ledger.parse import printable
from memgov._ledger.records import Held
from memgov._ledger.wake import Waker


@dataclass
class AdmissionTiming:
    """Where a claim's admission spent its time (its report line), so a slow start is explained."""

    started: float = field(default_factory=time.monotonic)
    tries: int = 0
    lock_wait_s: float = 0.0
    lock_held_max_s: float = 0.0
    nvml_s: float = 0.0

    def seconds(self) -> float:
        return time.monotonic() - self.started

    def count_look(self, nvml_s: float, asked: float, got: float) -> None:
        """One look under the lock, asked for at ``asked``, taken at ``got``, left now."""
        self.tries += 1
        self.nvml_s += nvml_s
        self.lock_wait_s += got - asked
        self.lock_held_max_s = max(self.lock_held_max_s, time.monotonic() - got)

    def report(self) -> str:
        total = self.seconds()
        return (
            f"admission: {total:.3f} s; {self.tries} look(s) under the admission lock, "
            f"waited {self.lock_wait_s:.3f} s for it, held it at most "
            f"{self.lock_held_max_s * 1000:.1f} ms; NVML {self.nvml_s:.3f} s, outside the lock"
        )


HEAD_POLL_S = 0.02
"""Longest sleep of the first waiter between checks that its request fits: a removal in the
device's folders wakes it at once (_wake); a holder killed by a signal removes nothing, so this
bounds how long its budget waits to be found free."""
BEHIND_POLL_S = 0.05
"""Longest sleep of a waiter behind others between looks at the ticket ahead (no lock taken)."""


@dataclass(frozen=True)
class Request:
    """What one claim asks admission for, on each device it may take (keyed by device UUID)."""

    sizes: Mapping[str, int]
    """Bytes asked for per device UUID (each of admit's ledgers has its entry)."""
    name: str
    wait_s: float | None = None
    """None: refused at once when there is no room; seconds: queued first come, first served."""
    modes: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    """(mode, why) per device UUID; a device not named: ("soft", "")."""
    compute: int | None = None
    """Percent of the GPU's SMs (hard mode), recorded when given."""
    daemons: tuple[int, ...] = ()
    """memgov's MPS daemons a hard claim may join (one with a client slot free)."""
    info: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """More fields for the record per device UUID (the job and where its size came from, for
    ``memgov status``)."""

    def mode(self, uuid: str) -> tuple[str, str]:
        return self.modes.get(uuid, ("soft", ""))

    def record(self, kind: str, ledger: DeviceLedger, daemon: int | None = None) -> dict[str, Any]:
        """The record this request writes on ``ledger``: a claim, or a queue ticket ("waiter")."""
        uuid = ledger.device.uuid
        mode, why = self.mode(uuid)
        extra: dict[str, Any] = {**self.info.get(uuid, {}), "mode_reason": why}
        if self.compute is not None:
            extra["compute"] = self.compute
        if daemon is not None:
            extra["mps_daemon"] = daemon
        return record_payload(kind, ledger.device, self.sizes[uuid], self.name, mode, **extra)


@dataclass(frozen=True)
class Admitted:
    """A claim admission let in: its record, written and locked on ``ledger``, and what it says."""

    ledger: DeviceLedger
    held: Held
    """The record's file: its flock is the claim's life (``ledger.remove("claims", held)``)."""
    bytes: int
    mode: str
    mode_reason: str
    id: str
    mps_daemon: int | None
    """The memgov MPS daemon whose client slot a hard claim took; None for the others."""
    record: dict[str, Any]
    """The record as written (a shrink rewrites it with its new size)."""
    timing: AdmissionTiming


class Refusal(NamedTuple):
    """Why one look did not admit the request on a device, and what it saw there."""

    snap: Snapshot
    ahead: int
    """Waiters queued ahead of this request."""
    never: bool
    """The request exceeds the device's capacity: it can never fit."""
    blocked: str | None
    """Why no MPS client slot or CUDA context is left (or the lock stayed held); None: one is."""


def admit(ledgers: list[DeviceLedger], request: Request) -> Admitted:
    """Wait for (or refuse) room for ``request`` on one of ``ledgers``; write the claim record.

    A hard claim also needs a client slot: with memgov's daemons it joins one that has room
    (recorded as ``mps_daemon``), else the one server's limit applies. A claim without MPS needs
    a CUDA context the device will still create (MEMGOV_CONTEXTS). Raises BudgetExceeded when
    there is no room (in ``request.wait_s``), saying why.
    """
    clock = AdmissionTiming()
    if request.wait_s is None:
        return _admit_now(ledgers, request, clock)
    return _admit_waiting(ledgers, request, request.wait_s, clock)


def _admit_now(ledgers: list[DeviceLedger], request: Request, clock: AdmissionTiming) -> Admitted:
    """No wait: one look per device, the most free first; refused at once where none admits."""
    refusals: list[Refusal] = []
    for ledger in _most_free_first(ledgers):
        got = _look(ledger, request, None, None, clock)
        if isinstance(got, Admitted):
            return got
        refusals.append(got)
    raise _refusal(refusals, request, never=all(refusal.never for refusal in refusals))


def _admit_waiting(
    ledgers: list[DeviceLedger], request: Request, wait_s: float, clock: AdmissionTiming
) -> Admitted:
    """Queue on every device the request fits, first come first served, until one admits it or
    ``wait_s`` is spent; the tickets and the watch go however this ends."""
    deadline = time.monotonic() + wait_s
    queue = _Queue(_fitting(ledgers, request), request, clock, deadline)
    try:
        queue.join()
        while True:
            got = queue.look()
            if isinstance(got, Admitted):
                return got
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            queue.sleep(min(got.poll, remaining), got)
    finally:
        queue.leave()
    # Counted once the tickets are gone: the count waits for the admission lock, and a ticket
    # left in the queue meanwhile would hold up every waiter behind it.
    raise queue.timed_out()


def _fitting(ledgers: list[DeviceLedger], request: Request) -> list[DeviceLedger]:
    """The devices whose capacity the request fits: a device it can never fit gets no ticket (it
    must not hold up that queue). None: refused at once, counted as too large."""
    fitting = [lg for lg in ledgers if request.sizes[lg.device.uuid] <= _capacity(lg.device)]
    if not fitting:
        for ledger in ledgers:
            _stats.add_locked(ledger, refused="too_large")
        refusals = [Refusal(lg.scan(clean=False), 0, True, None) for lg in ledgers]
        raise _refusal(refusals, request, never=True)
    return fitting


def _look(
    ledger: DeviceLedger,
    request: Request,
    ticket: Held | None,
    timeout: float | None,
    clock: AdmissionTiming,
    waiting: Callable[[], None] | None = None,
) -> Admitted | Refusal:
    """One admission under the device's lock (waited for at most ``timeout``, ``waiting``
    called while it is busy): the claim record written, or why not. ``ticket``: this request's
    place in the queue, if it waits."""
    uuid = ledger.device.uuid
    reading = ledger.read()  # NVML before the lock: it can be slow (_ledger's doc)
    removed_first = ledger.first_look(reading)
    asked = time.monotonic()
    with _stats.lock_timeouts(ledger, timeout), ledger.locked(timeout, waiting):
        got = time.monotonic()
        try:
            snap = ledger.scan(reading=reading)
            ahead = ledger.waiting(
                [q.record for q in snap.queue if ticket is None or q.record < ticket.name]
            )
            daemon, blocked = _slot(snap, request)
            size = request.sizes[uuid]
            admitted = ahead == 0 and size <= snap.free and blocked is None
            refusal = Refusal(snap, ahead, size > snap.capacity, blocked)
            _stats.add(ledger, removed_first + snap.reclaimed, _refused(admitted, ticket, refusal))
            _tell(ledger)
            if admitted:
                return _write_claim(ledger, request, daemon, clock)
        finally:
            clock.count_look(reading.seconds, asked, got)
    return refusal


def _slot(snap: Snapshot, request: Request) -> tuple[int | None, str | None]:
    """The MPS daemon a hard claim joins, and why there is no room for one more client or
    context (None: there is). Each hard claim is one client of an MPS server, which admits only
    so many; each other claim is one CUDA context, of which the device creates only so many:
    past that, wait or be refused like a budget that does not fit."""
    uuid = snap.device.uuid
    mode = request.mode(uuid)[0]
    if mode == "hard" and request.daemons:
        return _enforce.pick_daemon(snap.hard_by_daemon, request.daemons, uuid)
    blocked = _enforce.client_limit_reason(snap.hard_clients, mode, uuid)
    return None, blocked or _enforce.context_limit_reason(snap.contexts, mode, snap.device)


def _write_claim(
    ledger: DeviceLedger, request: Request, daemon: int | None, clock: AdmissionTiming
) -> Admitted:
    """Write the admitted claim's record (under the device's lock); what it says, typed."""
    record = request.record("claim", ledger, daemon)
    held = ledger.add("claims", record)
    uuid = ledger.device.uuid
    mode, why = request.mode(uuid)
    return Admitted(
        ledger=ledger,
        held=held,
        bytes=request.sizes[uuid],
        mode=mode,
        mode_reason=why,
        id=record["id"],
        mps_daemon=daemon,
        record=record,
        timing=clock,
    )


class _Watch(NamedTuple):
    """What a waiter sleeps on after a round of looks: the removals that may let it in (per
    folder, the names that matter; None: any), for at most ``poll`` seconds (a holder killed by
    a signal removes nothing)."""

    poll: float
    folders: dict[Path, frozenset[str] | None]


class _Queue:
    """A waiting request's tickets, one in the queue of each device it fits, and its looks: only
    the first waiter of a device takes that device's admission lock."""

    def __init__(
        self,
        ledgers: list[DeviceLedger],
        request: Request,
        clock: AdmissionTiming,
        deadline: float,
    ) -> None:
        self.ledgers = ledgers
        self.request = request
        self.clock = clock
        self.deadline = deadline
        self.tickets: dict[str, Held] = {}
        self.places: dict[str, QueuePlace] = {}
        self.last: dict[str, Refusal] = {}
        """Per device, the last look under its lock: what a refusal at the deadline says."""
        self.waker: Waker | None = None
        self.touched = 0.0
        """When this waiter last touched its tickets (time.monotonic())."""
        self.folders = {lg.path: (lg.path / "claims", lg.path / "queue") for lg in ledgers}
        """Per device, its claims/ and queue/: made once (a Path is built and hashed anew at
        each use), not at each of a waiter's looks."""

    def join(self) -> None:
        """A ticket on each device, and the watch on their folders that wakes this waiter."""
        for ledger in self.ledgers:
            self._take_ticket(ledger)
        self.waker = Waker([folder for lg in self.ledgers for folder in self.folders[lg.path]])
        self.touched = time.monotonic()

    def _take_ticket(self, ledger: DeviceLedger) -> None:
        """A ticket at the end of ``ledger``'s queue; one this waiter held there goes."""
        uuid = ledger.device.uuid
        old = self.tickets.get(uuid)
        self.tickets[uuid] = ledger.add("queue", self.request.record("waiter", ledger))
        place = self.places.get(uuid)
        self.places[uuid] = QueuePlace(ledger, self.tickets[uuid].name)
        if place is not None:
            place.close()
        if old is not None:
            ledger.remove("queue", old)

    def _touch(self) -> None:
        """Say this waiter runs: the others pass over a ticket untouched for STOPPED_WAITER_S
        (stopped). One that was (this waiter did not run for that long) lost its place: it
        queues again at the end, behind those that passed it."""
        if time.monotonic() - self.touched > STOPPED_WAITER_S:
            for ledger in self.ledgers:
                self._take_ticket(ledger)
        self._touched()

    def _touched(self) -> None:
        """Touch the tickets (also while the first waiter waits for the admission lock)."""
        self.touched = time.monotonic()
        for ticket in self.tickets.values():
            os.utime(ticket.file.fileno())

    def look(self) -> Admitted | _Watch:
        """One round over the devices: admitted where this waiter is first and fits, else what
        to wake up for."""
        assert self.waker is not None  # joined
        poll = BEHIND_POLL_S
        watch: dict[Path, frozenset[str] | None] = {}
        self._touch()
        # queue/ stays watched on every device; claims/ only where this waiter is first.
        watched = {self.folders[lg.path][1] for lg in self.ledgers}
        for ledger in self.ledgers:
            claims, queue = self.folders[ledger.path]
            place = self.places[ledger.device.uuid]
            if not place.first():
                # Someone is ahead: only the first waiter takes the admission lock; this one
                # wakes when the ticket just ahead goes.
                ahead = place.ahead
                watch[queue] = None if ahead is None else frozenset([ahead])
                continue
            poll = HEAD_POLL_S
            # Watched from before the look: a release right after it still wakes this waiter.
            watched.add(claims)
            self.waker.focus(watched)
            got = self._look_first(ledger)
            if isinstance(got, Admitted):
                return self._leave_queue(got)
            self.last[ledger.device.uuid] = got
            # First in line: what can let it in is a claim its look counted going away.
            watch[claims] = frozenset(c.record for c in got.snap.claims)
        self.waker.focus(watched)
        return _Watch(poll, watch)

    def _look_first(self, ledger: DeviceLedger) -> Admitted | Refusal:
        """The first waiter's look, waiting for the lock until the deadline at most."""
        ticket = self.tickets[ledger.device.uuid]
        try:
            timeout = max(self.deadline - time.monotonic(), 0.05)
            return _look(ledger, self.request, ticket, timeout, self.clock, self._touched)
        except LockTimeout as exc:
            if time.monotonic() < self.deadline:
                raise  # held past the lock's own bound (LOCK_TIMEOUT_S): say so
            return Refusal(ledger.scan(clean=False), 0, False, f"{exc}")

    def _leave_queue(self, admitted: Admitted) -> Admitted:
        """The admitted waiter's ticket goes; where that fails, so does its claim."""
        ledger = admitted.ledger
        try:
            # What this look judged reaches the next in line before the hand-over.
            _deadnames.flush()
            ledger.remove("queue", self.tickets.pop(ledger.device.uuid))
        except BaseException:
            ledger.remove("claims", admitted.held)  # admitted, but claim() will raise
            raise
        _count(ledger, "admitted", self.clock.seconds())
        return admitted

    def sleep(self, seconds: float, watch: _Watch) -> None:
        assert self.waker is not None  # joined
        with _signals.interruptible():  # Ctrl-C ends a wait (claim() defers it elsewhere)
            self.waker.sleep(seconds, functools.partial(_wanted, watch.folders))

    def timed_out(self) -> BudgetExceeded:
        """The refusal when the wait is spent, counted as a timeout on every device; a device
        whose lock this waiter never took says it was behind another."""
        refusals = [
            self.last.get(lg.device.uuid) or Refusal(lg.scan(False, queue=False), 1, False, None)
            for lg in self.ledgers
        ]
        for ledger in self.ledgers:
            _count(ledger, "timeout", self.clock.seconds())
        return _refusal(refusals, self.request, never=False)

    def leave(self) -> None:
        """Every ticket goes and the watch closes, whatever failed before or fails here."""
        try:
            _drop_tickets(self.ledgers, self.tickets)
        finally:
            for place in self.places.values():
                place.close()
            if self.waker is not None:
                self.waker.close()


_untold: dict[Path, tuple[DeviceLedger, list[tuple[str, float]]]] = {}
"""Per device, this process's ended waits (outcome, seconds) not counted yet: the lock was busy.
Counted at this process's next look under that device's lock, or at its exit."""


def _count(ledger: DeviceLedger, outcome: str, waited: float) -> None:
    """Count a wait that ended (and a timeout as a refusal) once the ticket is gone, and now
    only if the admission lock is free at once: a waiter that waited for the lock to count
    itself held up the next head of the queue, which needs that lock to be admitted (each one
    that timed out polled it for up to 0.5 s; the counts under the head's lock lengthened each
    hand-over)."""
    _untold.setdefault(ledger.path, (ledger, []))[1].append((outcome, waited))
    with contextlib.suppress(Exception), ledger.locked(0):
        _tell(ledger)


def _tell(ledger: DeviceLedger) -> None:
    """Count this process's untold waits on ``ledger`` (call it holding its lock)."""
    for outcome, waited in _untold.pop(ledger.path, (ledger, []))[1]:
        _stats.add(ledger, 0, "timeout" if outcome == "timeout" else None, (outcome, waited))


@atexit.register
def _tell_at_exit() -> None:
    while _untold:
        _, (ledger, waits) = _untold.popitem()
        for outcome, waited in waits:
            refused = "timeout" if outcome == "timeout" else None
            _stats.add_locked(ledger, refused, (outcome, waited))


# A child's counts are its own: its parent's untold timeouts are the parent's to count.
os.register_at_fork(after_in_child=_untold.clear)


def _wanted(watch: dict[Path, frozenset[str] | None], folder: Path, name: str) -> bool:
    """Whether removing ``name`` from ``folder`` may let a waiter in (``watch``: per folder, the
    names that matter; None: any). Another user's flood, or gc removing it, wakes no one."""
    if folder not in watch:
        return False
    names = watch[folder]
    return names is None or name in names


def _refused(admitted: bool, ticket: Held | None, refusal: Refusal) -> str | None:
    """The refusal one look under the lock counts (_stats): a claim that does not wait finding
    no room (a waiter's look is not a refusal; its wait is counted once it ends: _count)."""
    if admitted or ticket is not None:
        return None
    if refusal.never:
        return "too_large"
    if refusal.ahead:
        return "queued"
    return "no_slot" if refusal.blocked else "no_room"


def _drop_tickets(ledgers: list[DeviceLedger], tickets: dict[str, Held]) -> None:
    """Remove every ticket; one failing removal does not keep the others locked."""
    for ledger in ledgers:
        ticket = tickets.pop(ledger.device.uuid, None)
        if ticket is not None:
            try:
                ledger.remove("queue", ticket)
            finally:
                ticket.file.close()


def _uid(uid: int | None) -> str:
    return "?" if uid is None else str(uid)


def _capacity(device: _devices.Device) -> int:
    return max(0, device.total - _config.reserve(device.total, device.simulated))


def _most_free_first(ledgers: list[DeviceLedger]) -> list[DeviceLedger]:
    if len(ledgers) == 1:
        return ledgers
    # device="auto": try the device with the most free budget first; each try re-checks under
    # its own lock, so a stale order costs a retry, never an over-commit.
    return sorted(ledgers, key=lambda ledger: ledger.snapshot().free, reverse=True)


def _refusal(refusals: list[Refusal], request: Request, never: bool) -> BudgetExceeded:
    """The error for a request no device admitted, told from the device with the most free."""
    snap, ahead, _, blocked = max(refusals, key=lambda refusal: refusal.snap.free)
    uuid = snap.device.uuid
    size = request.sizes[uuid]
    largest = snap.largest_holders()
    holders = [(c.name, c.bytes) for c in largest]
    parts = [f"cannot claim {format_size(size)} on {uuid} ({snap.device.name}): " + snap.describe()]
    if holders:
        # The file's owner, not the record's text: a record may name another user's process.
        named = ", ".join(
            f"{printable(c.name)} {format_size(c.bytes)} (uid {_uid(c.uid)})" for c in largest
        )
        parts.append(f"largest holders: {named}")
    if blocked:
        parts.append(blocked)
    if ahead:
        parts.append(f"{ahead} claim(s) queued ahead (first come, first served)")
    if never:
        parts.append("it can never fit: the request exceeds the device's capacity")
    elif request.wait_s:
        parts.append(f"waited {request.wait_s:g} s")
    else:
        parts.append("pass wait=SECONDS to queue for it (MEMGOV_WAIT=SECONDS, memgov run --wait)")
    return BudgetExceeded(
        "; ".join(parts),
        device=uuid,
        requested=size,
        free=snap.free,
        holders=holders,
        queued_ahead=ahead,
    )
