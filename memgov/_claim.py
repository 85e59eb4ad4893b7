"""memgov.claim(): reserve a GPU memory budget for this process; make its frameworks keep to it."""

from __future__ import annotations

import atexit
import os
import sys
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

from memgov import _adapters, _config, _devices, _enforce, _settings, _threads
from memgov._errors import BudgetExceeded, ConfigError, LockTimeout, MemgovError
from memgov._ledger import DeviceLedger, QueuePlace, Snapshot, record_payload
from memgov._parse import printable
from memgov._records import Held
from memgov._sizes import Size, format_size
from memgov._wake import Waker

HOLDER_ENV = "MEMGOV_HOLDER"
"""Set while this process holds a claim (``<device uuid>/<record>``); children inherit it."""

_current: Claim | None = None
"""Set and cleared by single assignments: no lock, because a lock can be left held by an
exception that lands between its acquire and its block (an async exception, a signal handler's)."""


class _Attempt:
    """Marks a claim() in progress; only a weak reference is kept, so the mark ends with the
    attempt's frame even when an exception cuts short the code that would clear it."""


_claiming: dict[str, weakref.ref[_Attempt]] = {}
""""now" -> the claim() in progress; dict.setdefault is the atomic test-and-set."""


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
    _ledger: DeviceLedger | None = field(default=None, repr=False)
    _held: Held | None = field(default=None, repr=False)
    _restore: dict[str, str | None] = field(default_factory=dict, repr=False)

    @property
    def released(self) -> bool:
        return self._held is None

    def release(self) -> None:
        """Give the budget back. Frameworks cannot lift a cap once set, so release at the end."""
        global _current
        held, ledger = self._held, self._ledger
        try:
            self._held = None
            restore, self._restore = self._restore, {}
            if _current is self:
                _current = None
                os.environ.pop(HOLDER_ENV, None)
            _enforce.restore(restore)  # a child started from now on gets no stale MPS limit
        finally:
            # Whatever was raised above (Ctrl-C included), the lock is dropped: remove() closes
            # the record's file last, and a file it never reached is closed when collected.
            if held is not None and ledger is not None:
                ledger.remove("claims", held)

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
) -> Claim:
    """Reserve ``size`` of GPU memory for this process and cap its frameworks to it.

    ``size``: bytes, "2GiB", "512MiB", "2G" (binary), "2GB" (decimal) or "25%" of the device.
    ``device``: None (first visible GPU), an index (cuda:N), a GPU UUID, or "auto" (most free).
    ``wait``: None fails at once; seconds queue first-come-first-served for that long.
    ``compute``: percent of the GPU's SMs (1-100) this process may use; needs hard mode.
    The claim is hard (driver-enforced through MPS, see docs/hard-limits.md) when an MPS daemon
    is reachable and CUDA is not yet initialised in this process, else soft; ``Claim.mode`` and
    ``Claim.mode_reason`` say which and why.
    Raises BudgetExceeded when the budget does not fit, ValueError for bad arguments.
    """
    request = Size.of(size, "claim size")  # a Size from a setting keeps its variable's name
    wait_s = _settings.wait_seconds(wait, "wait")
    label = _check_name(name)
    chosen_threads = _threads.setting()  # checked before admission: an error must hold nothing
    compute_pct = _enforce.check_compute(compute)
    if _current is not None:
        # One claim per process: a holder that waits for more could deadlock with another.
        raise MemgovError(
            f"this process already holds {_current}; release it before claiming again"
        )
    attempt = _Attempt()
    mark = weakref.ref(attempt, _unmark)
    found = _claiming.setdefault("now", mark)
    if found is not mark:
        if found() is not None:
            # Not waited for: this thread's own wait (None: fail at once) must not be spent
            # behind another thread's.
            raise MemgovError(
                "another thread of this process is claiming right now; a process holds at "
                "most one claim, so claim in one thread (or in separate processes)"
            )
        _claiming["now"] = mark  # a mark whose attempt ended without clearing it
    try:
        result, touched, chosen = _claim_now(request, device, wait_s, label, compute_pct)
    finally:
        del attempt  # ends the mark (the weak reference dies with it)
    try:
        threads = _threads.govern(chosen_threads, holder=f"{chosen.uuid}/{result.record}")
    except BaseException:
        try:
            result.release()
        finally:
            _enforce.restore(touched)
        raise
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
    try:
        _adapters.govern(budget, result.reports)
    except BaseException:
        try:
            result.release()
        finally:
            _enforce.restore(touched)
        raise
    return result


def _unmark(mark: weakref.ref[_Attempt]) -> None:
    # The attempt ended (however): clear the mark if it is still this one.
    if _claiming.get("now") is mark:
        _claiming.pop("now", None)


def _claim_now(
    size: Size,
    device: int | str | None,
    wait_s: float | None,
    label: str,
    compute_pct: int | None,
) -> tuple[Claim, dict[str, str | None], _devices.Device]:
    global _current
    candidates = _devices.candidates(device)
    sizes = _sizes_on(size, candidates)
    candidates = [d for d in candidates if d.uuid in sizes]
    # The mode goes into the record, so it is decided before admission writes one.
    plan = _enforce.decide(candidates, _adapters.any_cuda_initialized())
    modes = {d.uuid: plan.mode(d, compute_pct) for d in candidates}
    timing = AdmissionTiming()
    ledger, held, payload = _admit(
        [DeviceLedger(d) for d in candidates], sizes, wait_s, label, modes, compute_pct,
        plan.daemons, timing,
    )
    chosen = ledger.device
    # Everything from here to the return can still fail (an adapter's configure_env, the
    # environment, Ctrl-C): the record is then released and the environment put back before
    # the exception propagates, so a failed claim() holds nothing.
    touched = {n: os.environ.get(n) for n in ("CUDA_VISIBLE_DEVICES", *_enforce.CLAIM_ENV)}
    try:
        result = _settle(ledger, held, payload, plan, label, compute_pct)
        result.admission_s = timing.seconds()
        result.reports["admission"] = timing.report()
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
    ledger: DeviceLedger,
    held: Held,
    payload: dict[str, Any],
    plan: _enforce.Plan,
    label: str,
    compute_pct: int | None,
) -> Claim:
    """Pin this process to the admitted GPU, apply hard mode's limit; the Claim to return."""
    chosen = ledger.device
    index = None if chosen.simulated else chosen.visible_index
    if not chosen.simulated and not _adapters.any_cuda_initialized():
        # Pin the frameworks to the claimed GPU: it becomes their cuda:0 (an inherited MPS
        # pinned limit is renumbered to match).
        _enforce.renumber_pinned(index)
        os.environ["CUDA_VISIBLE_DEVICES"] = chosen.uuid
        index = 0
    restore: dict[str, str | None] = {}
    if payload["mode"] == "hard":
        restore = _enforce.apply(plan, payload["bytes"], index or 0, compute_pct,
                                 payload.get("mps_daemon"))
    result = Claim(
        bytes=payload["bytes"],
        device=chosen.uuid,
        name=label,
        mode=payload["mode"],
        index=index,
        id=payload["id"],
        record=held.name,
        mode_reason=payload["mode_reason"],
        compute=compute_pct,
        _ledger=ledger,
        _held=held,
        _restore=restore,
    )
    if restore:
        result.reports["mps"] = _enforce.describe()
    return result


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
        return (f"admission: {total:.3f} s; {self.tries} look(s) under the admission lock, "
                f"waited {self.lock_wait_s:.3f} s for it, held it at most "
                f"{self.lock_held_max_s * 1000:.1f} ms; NVML {self.nvml_s:.3f} s, outside the lock")


HEAD_POLL_S = 0.02
"""Longest sleep of the first waiter between checks that its request fits: a removal in the
device's folders wakes it at once (_wake); a holder killed by a signal removes nothing, so this
bounds how long its budget waits to be found free."""
BEHIND_POLL_S = 0.05
"""Longest sleep of a waiter behind others between looks at the ticket ahead (no lock taken)."""

Refusal = tuple[Snapshot, int, bool, str | None]


def _admit(
    ledgers: list[DeviceLedger],
    sizes: dict[str, int],
    wait_s: float | None,
    name: str,
    modes: dict[str, tuple[str, str]] | None = None,
    compute: int | None = None,
    daemons: tuple[int, ...] = (),
    timing: AdmissionTiming | None = None,
) -> tuple[DeviceLedger, Held, dict[str, Any]]:
    """Wait for (or refuse) room on one of ``ledgers``; write the claim record there.

    A hard claim also needs a client slot: with memgov's ``daemons`` it joins one that has room
    (recorded as ``mps_daemon``), else the one server's limit applies. A claim without MPS needs
    a CUDA context the device will still create (MEMGOV_CONTEXTS).
    """

    clock = timing or AdmissionTiming()

    def payload_for(kind: str, ledger: DeviceLedger, daemon: int | None = None
                    ) -> dict[str, Any]:
        uuid = ledger.device.uuid
        mode, why = (modes or {}).get(uuid, ("soft", ""))
        extra: dict[str, Any] = {"mode_reason": why}
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
                if ahead == 0 and sizes[uuid] <= snap.free and blocked is None:
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
            for ledger in fitting:
                uuid = ledger.device.uuid
                if not places[uuid].first():
                    continue  # someone is ahead: only the first waiter takes the admission lock
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
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                refusals = [
                    last.get(lg.device.uuid) or (lg.scan(False, queue=False), 1, False, None)
                    for lg in fitting
                ]
                raise _refusal(refusals, sizes, wait_s, False)
            waker.sleep(min(poll, remaining))
    finally:
        try:
            _drop_tickets(fitting, tickets)
        finally:
            if waker is not None:
                waker.close()


def _drop_tickets(ledgers: list[DeviceLedger], tickets: dict[str, Held]) -> None:
    """Remove every ticket; one failing removal does not keep the others locked."""
    for ledger in ledgers:
        ticket = tickets.pop(ledger.device.uuid, None)
        if ticket is not None:
            try:
                ledger.remove("queue", ticket)
            finally:
                ticket.file.close()


def _capacity(device: _devices.Device) -> int:
    return max(0, device.total - _config.reserve(device.total, device.simulated))


def _sizes_on(size: Size, candidates: list[_devices.Device]) -> dict[str, int]:
    """Device UUID -> the request in bytes, for each candidate device that could ever hold it."""
    sizes: dict[str, int] = {}
    error: ValueError | None = None
    for device in candidates:
        try:
            sizes[device.uuid] = size.on(device.total)
        except ValueError as exc:  # device="auto" skips a GPU too small for it, unless all are
            error = error or ConfigError(str(exc))
    if error is not None and not sizes:
        raise error
    return sizes


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
    holders = [(c.name, c.bytes) for c in snap.largest_holders()]
    parts = [
        f"cannot claim {format_size(sizes[uuid])} on {uuid} ({snap.device.name}): "
        + snap.describe()
    ]
    if holders:
        named = ", ".join(f"{printable(n)} {format_size(b)}" for n, b in holders)
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


def _check_name(name: object) -> str:
    if name is None:
        program = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
        return f"{program or 'python'}:{os.getpid()}"
    if not isinstance(name, str) or not name.strip() or len(name) > 128 or not name.isprintable():
        raise ValueError(f"name={name!r}: accepted a printable string of 1 to 128 characters")
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
    claim_now = _current
    if claim_now is not None:
        claim_now.release()


os.register_at_fork(after_in_child=_forget_in_child)
atexit.register(_release_at_exit)
