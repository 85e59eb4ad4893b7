"""Admission: wait for (or refuse) room on a device, under its lock, and write the claim record.

``claim()`` (memgov/_claim.py) decides what to ask for (sizes per device, modes, MPS daemons) and
settles what it got; this module does the one read-modify-write of the ledger that a claim is:
NVML read before the device's lock (_ledger), then under it the scan, the decision and the record.
Waiters hold a ticket in the device's queue and only the first of them takes the lock, woken by
removals in the device's folders (_wake).
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memgov import _config, _devices, _enforce, _stats
from memgov._errors import BudgetExceeded, LockTimeout
from memgov._ledger import DeviceLedger, QueuePlace, Snapshot, record_payload
from memgov._parse import printable
from memgov._records import Held
from memgov._sizes import format_size
from memgov._wake import Waker


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

Refusal = tuple[Snapshot, int, bool, str | None]


def admit(
    ledgers: list[DeviceLedger],
    sizes: dict[str, int],
    wait_s: float | None,
    name: str,
    modes: dict[str, tuple[str, str]] | None = None,
    compute: int | None = None,
    daemons: tuple[int, ...] = (),
    timing: AdmissionTiming | None = None,
    info: dict[str, dict[str, Any]] | None = None,
) -> tuple[DeviceLedger, Held, dict[str, Any]]:
    """Wait for (or refuse) room on one of ``ledgers``; write the claim record there.

    A hard claim also needs a client slot: with memgov's ``daemons`` it joins one that has room
    (recorded as ``mps_daemon``), else the one server's limit applies. A claim without MPS needs
    a CUDA context the device will still create (MEMGOV_CONTEXTS). ``info``: per device UUID,
    more fields for the record (the job and where its size came from, for ``memgov status``).
    """

    clock = timing or AdmissionTiming()

    def payload_for(kind: str, ledger: DeviceLedger, daemon: int | None = None) -> dict[str, Any]:
        uuid = ledger.device.uuid
        mode, why = (modes or {}).get(uuid, ("soft", ""))
        extra: dict[str, Any] = {"mode_reason": why, **(info or {}).get(uuid, {})}
        if compute is not None:
            extra["compute"] = compute
        if daemon is not None:
            extra["mps_daemon"] = daemon
        return record_payload(kind, ledger.device, sizes[uuid], name, mode, **extra)

    def slot(snap: Snapshot, mode: str) -> tuple[int | None, str | None]:
        uuid = snap.device.uuid
        if mode == "hard" and daemons:
            return _enforce.pick_daemon(snap.hard_by_daemon, daemons, uuid)
        blocked = _enforce.client_limit_reason(snap.hard_clients, mode, uuid)
        return None, blocked or _enforce.context_limit_reason(snap.contexts, mode, snap.device)

    def attempt(
        ledger: DeviceLedger, mine: Held | None, timeout: float | None
    ) -> tuple[Held, dict[str, Any]] | Refusal:
        """One admission under the device's lock: the admitted record, or why not."""
        uuid = ledger.device.uuid
        reading = ledger.read()  # NVML before the lock: it can be slow (_ledger's doc)
        removed_first = ledger.first_look(reading)
        asked = time.monotonic()
        with ledger.locked(timeout):
            got = time.monotonic()
            try:
                snap = ledger.scan(reading=reading)
                ahead = sum(1 for q in snap.queue if mine is None or q.record < mine.name)
                mode = (modes or {}).get(uuid, ("soft", ""))[0]
                # Each hard claim is one client of an MPS server, which admits only so many;
                # each other claim is one CUDA context, of which the device creates only so
                # many: past that, wait or be refused like a budget that does not fit.
                daemon, blocked = slot(snap, mode)
                admitted = ahead == 0 and sizes[uuid] <= snap.free and blocked is None
                _stats.add(
                    ledger,
                    removed_first + len(snap.removed),
                    *_counted(admitted, mine, snap, ahead, sizes[uuid], blocked, clock),
                )
                if admitted:
                    payload = payload_for("claim", ledger, daemon)
                    return ledger.add("claims", payload), payload
            finally:
                clock.tries += 1
                clock.nvml_s += reading.seconds
                clock.lock_wait_s += got - asked
                clock.lock_held_max_s = max(clock.lock_held_max_s, time.monotonic() - got)
        return (snap, ahead, sizes[uuid] > snap.capacity, blocked)

    if wait_s is None:
        refusals: list[Refusal] = []
        for ledger in _most_free_first(ledgers):
            got = attempt(ledger, None, None)
            if len(got) == 2:
                return ledger, got[0], got[1]
            refusals.append(got)
        never = all(impossible for _, _, impossible, _ in refusals)
        raise _refusal(refusals, sizes, wait_s, never)

    deadline = time.monotonic() + wait_s
    # A device the request can never fit gets no ticket: it must not hold up that queue.
    fitting = [lg for lg in ledgers if sizes[lg.device.uuid] <= _capacity(lg.device)]
    if not fitting:
        for ledger in ledgers:
            _stats.add_locked(ledger, refused="too_large")
        raise _refusal(
            [(lg.scan(clean=False), 0, True, None) for lg in ledgers], sizes, wait_s, True
        )
    tickets: dict[str, Held] = {}
    last: dict[str, Refusal] = {}
    waker: Waker | None = None
    try:
        for ledger in fitting:
            tickets[ledger.device.uuid] = ledger.add("queue", payload_for("waiter", ledger))
        waker = Waker([lg.path / part for lg in fitting for part in ("claims", "queue")])
        places = {lg.device.uuid: QueuePlace(lg, tickets[lg.device.uuid].name) for lg in fitting}
        while True:
            poll = BEHIND_POLL_S
            watch: dict[Path, frozenset[str] | None] = {}
            for ledger in fitting:
                uuid = ledger.device.uuid
                if not places[uuid].first():
                    # Someone is ahead: only the first waiter takes the admission lock; this
                    # one wakes when the ticket just ahead goes.
                    ahead = places[uuid].ahead
                    watch[ledger.path / "queue"] = None if ahead is None else frozenset([ahead])
                    continue
                poll = HEAD_POLL_S
                try:
                    got = attempt(ledger, tickets[uuid], max(deadline - time.monotonic(), 0.05))
                except LockTimeout as exc:
                    if time.monotonic() < deadline:
                        raise  # held past the lock's own bound (LOCK_TIMEOUT_S): say so
                    got = (ledger.scan(clean=False), 0, False, f"{exc}")
                if len(got) == 2:
                    held, payload = got
                    try:
                        ledger.remove("queue", tickets.pop(uuid))
                    except BaseException:
                        ledger.remove("claims", held)  # admitted, but claim() will raise
                        raise
                    return ledger, held, payload
                last[uuid] = got
                # First in line: what can let it in is a claim its look counted going away.
                watch[ledger.path / "claims"] = frozenset(c.record for c in got[0].claims)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                refusals = [
                    last.get(lg.device.uuid) or (lg.scan(False, queue=False), 1, False, None)
                    for lg in fitting
                ]
                for ledger in fitting:
                    _stats.add_locked(ledger, "timeout", ("timeout", clock.seconds()))
                raise _refusal(refusals, sizes, wait_s, False)
            waker.sleep(min(poll, remaining), functools.partial(_wanted, watch))
    finally:
        try:
            _drop_tickets(fitting, tickets)
        finally:
            if waker is not None:
                waker.close()


def _wanted(watch: dict[Path, frozenset[str] | None], folder: Path, name: str) -> bool:
    """Whether removing ``name`` from ``folder`` may let a waiter in (``watch``: per folder, the
    names that matter; None: any). Another user's flood, or gc removing it, wakes no one."""
    if folder not in watch:
        return False
    names = watch[folder]
    return names is None or name in names


def _counted(
    admitted: bool,
    ticket: Held | None,
    snap: Snapshot,
    ahead: int,
    size: int,
    blocked: str | None,
    clock: AdmissionTiming,
) -> tuple[str | None, tuple[str, float] | None]:
    """What one look under the lock counts (_stats): a queued claim's wait when it gets in; a
    refusal when a claim that does not wait finds no room (a waiter's look is not a refusal)."""
    if ticket is not None:
        return None, ("admitted", clock.seconds()) if admitted else None
    if admitted:
        return None, None
    if size > snap.capacity:
        return "too_large", None
    if ahead:
        return "queued", None
    return ("no_slot" if blocked else "no_room"), None


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


def _refusal(
    refusals: list[Refusal],
    sizes: dict[str, int],
    wait_s: float | None,
    never: bool,
) -> BudgetExceeded:
    snap, ahead, _, blocked = max(refusals, key=lambda r: r[0].free)
    uuid = snap.device.uuid
    largest = snap.largest_holders()
    holders = [(c.name, c.bytes) for c in largest]
    parts = [
        f"cannot claim {format_size(sizes[uuid])} on {uuid} ({snap.device.name}): "
        + snap.describe()
    ]
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
    elif wait_s:
        parts.append(f"waited {wait_s:g} s")
    else:
        parts.append("pass wait=SECONDS to queue for it")
    return BudgetExceeded(
        "; ".join(parts),
        device=uuid,
        requested=sizes[uuid],
        free=snap.free,
        holders=holders,
        queued_ahead=ahead,
    )
