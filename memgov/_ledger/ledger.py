"""The host's ledger of claims: one folder per GPU UUID under MEMGOV_DIR.

    $MEMGOV_DIR/v1/<gpu-uuid>/admission.lock   serialises admissions (a blocking flock, _flock)
    $MEMGOV_DIR/v1/<gpu-uuid>/claims/*.json    one record per live claim, flock-held by its holder
    $MEMGOV_DIR/v1/<gpu-uuid>/queue/*.json     one record per waiting claimer, in arrival order

Admission is the only read-modify-write of the records and runs under the admission lock: scan
the live records, decide, write the new record. NVML is read just before the lock is taken
(:meth:`DeviceLedger.read`), not under it: its figures describe processes outside the lock's
reach anyway, and while many processes create CUDA contexts an NVML query can take seconds,
which would serialise every claimer behind it. A reading taken earlier can only count a holder
that released since then as still using memory: conservative. Releases need no lock: removing a
record only frees room, and a concurrent admission that still sees it is merely conservative.
Liveness comes from each record's own flock (see _records), so a dead holder's budget is free at
the next scan; its file is removed once the lock is released (:meth:`DeviceLedger.locked`), like
every dead file a scan under the lock finds.
"""

from __future__ import annotations

import os
import re
import select
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memgov._base import config as _config
from memgov._base.errors import LedgerError
from memgov._base.sizes import format_size
from memgov._files import flock as _flock
from memgov._files.flock import AdmissionLock
from memgov._gpu import nvml as _nvml
from memgov._gpu.devices import Device, refresh
from memgov._ledger import deadnames as _deadnames, records as _records
from memgov._ledger.attribution import Attribution, Holder, attribute, pidns_of
from memgov._ledger.parse import printable

VERSION_DIR = _records.VERSION_DIR
LOOK_AHEAD = 64
"""Names new to this process in one of a device's folders that make it judge them before it
takes the admission lock (first_look): more than live claims and tickets come and go between
two looks of a process, so only a wave of files (another user's) does."""
_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


@dataclass(frozen=True)
class Reading:
    """What NVML says of a device at one moment: its memory use and the processes on it."""

    device: Device
    processes: dict[int, int | None] | None
    seconds: float
    """How long the queries took (they run outside the admission lock)."""


@dataclass(frozen=True)
class Entry:
    """A live claim or a queued claimer, as recorded."""

    record: str
    kind: str
    id: str
    name: str
    bytes: int
    pid: int
    pidns: int | None
    host: str
    uid: int | None
    created: float
    mode: str
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_record(cls, seen: _records.Seen) -> Entry:
        data = seen.data or {}
        known = {
            "version",
            "id",
            "kind",
            "device",
            "bytes",
            "name",
            "pid",
            "pidns",
            "host",
            "created",
            "mode",
        }
        pidns = data.get("pidns")
        return cls(
            record=seen.name,
            kind=data["kind"],
            id=data["id"],
            name=data["name"],
            bytes=data["bytes"],
            pid=data["pid"],
            pidns=pidns if isinstance(pidns, int) else None,
            host=str(data.get("host", "")),
            uid=seen.owner,
            created=float(data["created"]),
            mode=str(data.get("mode", "soft")),
            extra={k: v for k, v in data.items() if k not in known},
        )


@dataclass
class Snapshot:
    """One consistent view of a device's budget."""

    device: Device
    reserve: int
    claims: list[Entry]
    queue: list[Entry]
    use: dict[str, int | None]
    """Claim record -> bytes its process uses now (None where not visible)."""
    outside: int
    """Bytes used on the device outside every claim (NVML), the driver's own included."""
    problems: list[str]
    removed: list[str]
    unknown: list[str] = field(default_factory=list)
    """Live claim records whose size cannot be read: while any exists, nothing is free."""
    reclaimed: int = 0
    """Dead files this scan removed, or (under the admission lock) found and removes once the
    lock is released (``removed`` then fills in: :meth:`DeviceLedger.locked`)."""
    rebuilt: list[str] = field(default_factory=list)
    """Folders gc rebuilt because a flood had left them large (:meth:`DeviceLedger.compact`)."""

    @property
    def claimed(self) -> int:
        return sum(c.bytes for c in self.claims)

    @property
    def capacity(self) -> int:
        return max(0, self.device.total - self.reserve)

    @property
    def free(self) -> int:
        if self.unknown:
            return 0
        return max(0, self.capacity - self.claimed - self.outside)

    @property
    def hard_clients(self) -> int:
        """Live hard-mode claims: each is one client of the device's MPS server."""
        return sum(1 for c in self.claims if c.mode == "hard")

    @property
    def hard_by_daemon(self) -> dict[int, int]:
        """Live hard-mode claims per memgov MPS daemon (a record without a number counts as 0)."""
        counts: dict[int, int] = {}
        for c in self.claims:
            if c.mode == "hard":
                k = c.extra.get("mps_daemon")
                k = k if isinstance(k, int) and not isinstance(k, bool) else 0
                counts[k] = counts.get(k, 0) + 1
        return counts

    @property
    def contexts(self) -> int:
        """Live claims without MPS: each process holds its own CUDA context on the device."""
        return sum(1 for c in self.claims if c.mode != "hard")

    def largest_holders(self, n: int = 3) -> list[Entry]:
        return sorted(self.claims, key=lambda c: c.bytes, reverse=True)[:n]

    def describe(self) -> str:
        blocked = (
            f"; {len(self.unknown)} live record(s) of unknown size block it: "
            + ", ".join(self.unknown[:3])
            if self.unknown
            else ""
        )
        return (
            f"free budget {format_size(self.free)} of {format_size(self.device.total)} "
            f"(claimed {format_size(self.claimed)} by {len(self.claims)} claim(s), "
            f"{format_size(self.outside)} used outside memgov, "
            f"{format_size(self.reserve)} reserve){blocked}"
        )


new_record_name = _records.new_record_name


def folder_name(uuid: str) -> str:
    return _SAFE.sub("_", uuid)


def claim_alive(uuid: str, record: str, root: Path | None = None) -> bool:
    """Whether claim ``record`` of device ``uuid`` exists and its holder still holds its lock.

    False when it cannot be read (no such ledger, device or record, no permission, a name that is
    no record's): a child then has no live parent claim to defer to (MEMGOV_HOLDER).
    """
    if not record.endswith(_records.SUFFIX) or "/" in record or record.startswith("."):
        return False
    try:
        parts = (VERSION_DIR, folder_name(uuid), "claims")
        with _flock.open_dir(root or _config.ledger_dir(), parts, create=False) as fd:
            seen = _records._read(fd, record)
    except Exception:  # whatever another user left there: not a live claim of ours
        return False
    return seen is not None and seen.alive


class DeviceLedger:
    """The ledger of one device."""

    def __init__(self, device: Device, root: Path | None = None) -> None:
        self.device = device
        self.root = root if root is not None else _config.ledger_dir()
        self.parts = (VERSION_DIR, folder_name(device.uuid))
        self.path = self.root.joinpath(*self.parts)
        self._burials: list[_Burial] | None = None
        """While this ledger holds the admission lock: the dead files its cleaning scans found,
        removed once the lock is released (:meth:`locked`)."""

    # -- locking -------------------------------------------------------------------------------
    def locked(
        self, timeout: float | None = None, waiting: Callable[[], None] | None = None
    ) -> _Locked:
        """The device's admission lock, waited for at most ``timeout``; None: LOCK_TIMEOUT_S of
        one holder (claims taking it in turn on a busy host fail no claim that does not wait).
        ``waiting``: called about once a second while it is busy.

        A cleaning scan under it judges every file but removes none: the dead files it found
        are removed once the lock is released. Removing a file no one holds needs no lock (a
        release takes none either), and each unlink in a folder another user floods waits for
        that folder's own lock, behind the flood's creations: root's gc held the admission lock
        for up to 383 ms so, and every claimer waited (docs/ledger.md, "Floods")."""
        with _flock.open_dir(self.root, self.parts, create=True) as fd:
            # Make the folders first (checked, no symlinks); only the folder's owner (or root)
            # creates the lock file in it.
            folder = os.fstat(fd)
        mine = folder.st_uid == os.geteuid() or os.geteuid() == 0
        limit = _config.LOCK_TIMEOUT_S if timeout is None else timeout
        lock = AdmissionLock(
            self.path / "admission.lock",
            limit,
            may_create=mine,
            folder=folder,
            per_holder=timeout is None,
            waiting=waiting,
        )
        return _Locked(self, lock)

    def _bury(self, burials: list[_Burial]) -> None:
        """Remove the dead files found under the lock (each checked again: _records.remove_dead
        unlinks a name only while it still points at the file judged dead)."""
        for section in dict.fromkeys(b.section for b in burials):
            try:
                with _flock.open_dir(self.root, (*self.parts, section), create=False) as fd:
                    for burial in burials:
                        if burial.section == section:
                            burial.filing.remove(fd, self.path / section, burial.seen)
            except (OSError, LedgerError):
                pass  # the folder went (someone wiped the ledger): nothing is left to remove

    # -- reading -------------------------------------------------------------------------------
    def read(self) -> Reading:
        """NVML's view of the device now; admission takes it before the lock (module doc)."""
        start = time.monotonic()
        if self.device.simulated:
            return Reading(self.device, None, 0.0)
        device = refresh(self.device)
        processes = _nvml.processes(device.uuid)
        return Reading(device, processes, time.monotonic() - start)

    def scan(
        self,
        clean: bool = True,
        queue: bool = True,
        reading: Reading | None = None,
        sweep: bool = False,
        memo: str | None = None,
    ) -> Snapshot:
        """Read the live claims and queue; call under ``locked()`` for a consistent view.

        ``clean`` removes dead holders' files where this user may, and every other file no one
        holds (nobody's live claim): at once, or under ``locked()`` once the lock is released
        (``removed`` fills in then); ``sweep`` (gc) opens files whose names are not memgov's
        too, so that those go as well; ``queue=False`` skips the queue (a refusal's message
        needs only the claims). ``reading``: NVML's view taken just before the lock
        (:meth:`read`); None reads it now. ``memo`` (with ``clean=False``): "note" the files found
        dead for good, or "use" the last note: those are not looked at again (_records.scan).
        """
        reading = reading or self.read()
        device = reading.device
        filing = _Filing(device, clean, later=self._burials)
        for section in ("claims", "queue") if queue else ("claims",):
            folder = self.path / section
            with _flock.open_dir(self.root, (*self.parts, section), create=True) as fd:
                found = _records.scan(
                    fd, folder, sweep=sweep, remember=clean, memo=memo, root=self.root
                )
                for seen in found:
                    filing.file(seen, fd, folder, section)
                filing.summarise(folder)
        claims = filing.sections["claims"]
        if device.simulated:
            # A simulated device's USED is by definition taken by processes outside memgov.
            split = Attribution({c.record: None for c in claims}, device.used)
        else:
            split = attribute(
                device.used,
                (Holder(c.record, c.bytes, c.pid, c.pidns) for c in claims),
                reading.processes,
            )
        return Snapshot(
            device=device,
            reserve=_config.reserve(device.total, device.simulated),
            claims=claims,
            queue=filing.sections["queue"],
            use=split.use,
            outside=split.outside,
            problems=filing.problems,
            removed=filing.removed,
            unknown=filing.unknown,
            reclaimed=filing.reclaimed,
        )

    def first_look(self, reading: Reading | None = None) -> int:
        """:meth:`look_ahead`; how many dead records it removed (the exporter counts them as
        reclaimed)."""
        ahead = self.look_ahead(reading)
        return len(ahead.removed) if ahead is not None else 0

    def look_ahead(self, reading: Reading | None = None) -> Snapshot | None:
        """A scan taken without the admission lock before a cleaning scan under it (a claim's
        look, :meth:`snapshot`, root's gc), where this process has not scanned the device yet
        or LOOK_AHEAD or more names there are new to it: every file another user left is
        judged here (and known dead from then on, _deadnames), so the scan under the lock
        looks only at what changed since. Otherwise a new process, or one that meets a wave of
        another user's files, would hold the lock for one look per file, and hold off every
        claimer meanwhile. What it learned goes to this user's store of dead names
        (_deadnames.flush), for this user's other and later processes. ``reading``: NVML's
        view for the scan (None: read now). The scan, or None where none was due (or it
        failed: the scan under the lock finds and says what is wrong)."""
        try:
            due = False
            for section in ("claims", "queue"):
                parts = (*self.parts, section)
                with _flock.open_dir(self.root, parts, create=False) as fd:
                    due = due or not _records.remembers(fd)
                    due = due or _records.unjudged(fd) >= LOOK_AHEAD
            if due:
                # This user's dead files go now: no lock needed.
                return self.scan(reading=reading)
        except (OSError, LedgerError):
            pass
        finally:
            _deadnames.flush()
        return None

    def compact(self) -> list[str]:
        """Rebuild ``claims/`` where a flood left it large (memgov/_ledger/compact.py): gc's, under
        the admission lock, as the folder's owner or root. What was rebuilt, in words."""
        from memgov._ledger import compact as _compact  # gc's alone: no claim imports it

        with _flock.open_dir(self.root, self.parts, create=False) as fd:
            size = os.stat("claims", dir_fd=fd, follow_symlinks=False).st_size
            carried = _compact.compact(fd, "claims")
        if carried is None:
            return []
        return [
            f"{self.path / 'claims'}: a flood had left the folder {format_size(size)} large, "
            f"which every listing reads; a new one holds its {carried} record(s)"
        ]

    def remove_rebuilt(self) -> list[str]:
        """Remove what earlier rebuilds left (gc's, without the admission lock), in words."""
        from memgov._ledger import compact as _compact

        with _flock.open_dir(self.root, self.parts, create=False) as fd:
            old = _compact.remove_old(fd)
        return [f"{self.path / name} (left by an earlier rebuild)" for name in old]

    def waiting(self, names: list[str]) -> int:
        """How many of the queue tickets ``names`` hold a place: the others' waiters have not
        looked for STOPPED_WAITER_S and are passed over."""
        if not names:
            return 0
        stopped = time.time() - STOPPED_WAITER_S
        with _flock.open_dir(self.root, (*self.parts, "queue"), create=False) as fd:
            return sum(1 for name in names if not _passed_over(fd, name, stopped))

    def snapshot(self) -> Snapshot:
        """A consistent view under the admission lock; a flood is judged before it
        (:meth:`first_look`), not while every claimer waits for the lock."""
        reading = self.read()
        self.first_look(reading)
        with self.locked():
            return self.scan(reading=reading)

    # -- writing -------------------------------------------------------------------------------
    def add(self, section: str, payload: dict[str, Any]) -> _records.Held:
        with _flock.open_dir(self.root, (*self.parts, section), create=True) as fd:
            return _records.create(fd, self.path / section, new_record_name(), payload)

    def update(self, section: str, held: _records.Held, payload: dict[str, Any]) -> None:
        with _flock.open_dir(self.root, (*self.parts, section), create=True) as fd:
            _records.replace(fd, held, payload)

    def remove(self, section: str, held: _records.Held) -> None:
        """Unlink a held record and drop its lock; the lock is dropped whatever fails."""
        try:
            with _flock.open_dir(self.root, (*self.parts, section), create=False) as fd:
                _records.release(fd, held)
        except (FileNotFoundError, LedgerError):
            pass  # folder gone or unusable (someone wiped the ledger): dropping the lock is all
        finally:
            held.file.close()  # idempotent: never a second close of a reused number


def record_payload(
    kind: str, device: Device, size: int, name: str, mode: str, **extra: Any
) -> dict[str, Any]:
    return {
        "version": _records.VERSION,
        "id": os.urandom(8).hex(),
        "kind": kind,
        "device": device.uuid,
        "bytes": size,
        "name": name,
        "pid": os.getpid(),
        "pidns": pidns_of(),
        "host": socket.gethostname(),
        "created": time.time(),
        "mode": mode,
        **_records.writer(),
        **extra,
    }


def _old(folder_fd: int, name: str) -> bool:
    return _records.stale(folder_fd, name)


LEFT_SHOWN = 20
"""Dead files a scan leaves (another user's, or a read-only scan) named one by one per folder;
the rest are counted: a flood of them costs no line (or string) each."""


class _Locked:
    """:meth:`DeviceLedger.locked`: the admission lock held, and the dead files that cleaning
    scans found meanwhile removed once it is released."""

    def __init__(self, ledger: DeviceLedger, lock: AdmissionLock) -> None:
        self.ledger, self.lock = ledger, lock
        self.burials: list[_Burial] = []
        self.outer: list[_Burial] | None = None

    def __enter__(self) -> AdmissionLock:
        got = self.lock.__enter__()
        self.outer, self.ledger._burials = self.ledger._burials, self.burials
        return got

    def __exit__(self, *exc: object) -> None:
        self.ledger._burials = self.outer
        try:
            self.lock.__exit__(*exc)
        finally:
            self.ledger._bury(self.burials)


@dataclass
class _Burial:
    """A dead file a scan under the admission lock found, removed once the lock is released."""

    section: str
    seen: _records.Seen
    filing: _Filing


class _Filing:
    """Where each file of one scan goes: a live entry, a problem, or (dead, if ``clean``)
    removed where this user may: now, or into ``later`` (a scan under the admission lock:
    :meth:`DeviceLedger.locked` removes them once it is released)."""

    def __init__(self, device: Device, clean: bool, later: list[_Burial] | None = None) -> None:
        self.device = device
        self.clean = clean
        self.later = later
        self.reclaimed = 0
        """Dead files removed, or left for ``later`` to remove."""
        self.sections: dict[str, list[Entry]] = {"claims": [], "queue": []}
        self.problems: list[str] = []
        self.removed: list[str] = []
        self.unknown: list[str] = []
        """Live claim records whose size cannot be read (they block the device)."""
        self.left = 0
        """Dead files left in the current folder (see LEFT_SHOWN)."""

    def file(self, seen: _records.Seen, fd: int, folder: Path, section: str) -> None:
        if not seen.name:  # a summary line (files not opened)
            self.problems.append(f"{printable(str(folder))}: {seen.problem}")
        elif seen.alive:
            self._live(seen, folder, section)
        else:
            self._dead(seen, fd, folder, section)

    def _live(self, seen: _records.Seen, folder: Path, section: str) -> None:
        where = printable(str(folder / seen.name))
        if seen.data is not None:
            if seen.data["device"] == self.device.uuid:
                self.sections[section].append(Entry.from_record(seen))
            else:
                self.problems.append(f"{where}: record of device {printable(seen.data['device'])}")
            return
        owner = _uid(seen.owner)
        if section == "claims" and _records.RECORD_NAME.match(seen.name):
            # A live claim whose size cannot be known: it blocks (fail closed).
            self.unknown.append(where)
            self.problems.append(
                f"{where}: {seen.problem} (holder alive, uid {owner}); its size is unknown, "
                "so no claim is admitted on this device until it is released or removed"
            )
        else:
            self.problems.append(f"{where}: {seen.problem} (holder alive, uid {owner})")

    def _dead(self, seen: _records.Seen, fd: int, folder: Path, section: str) -> None:
        debris = seen.name.startswith(_flock.TMP_PREFIX)
        folder_like = seen.problem == "not a regular file" and _flock.is_dir(fd, seen.name)
        if not self.clean or folder_like or (debris and not _old(fd, seen.name)):
            if seen.problem and not debris:
                self._leave(folder, seen, f"{seen.problem} (uid {_uid(seen.owner)})")
            return  # a read-only scan, a folder, or a temporary file being written right now
        # Unlocked: nobody's live claim, whatever it holds (a live record is locked from the
        # moment it has its name). Removed where this user may: root's gc clears any flood.
        mine = os.geteuid() in (0, seen.owner) or seen.owner is None
        if not mine:
            label = seen.problem or "dead holder"
            self._leave(folder, seen, f"{label} (uid {_uid(seen.owner)}); {_records.NOT_MINE}")
        elif self.later is not None and not seen.locked:  # locked: remove() leaves it (HELD)
            self.later.append(_Burial(section, seen, self))
            self.reclaimed += 1
        else:
            self.reclaimed += self.remove(fd, folder, seen)

    def remove(self, fd: int, folder: Path, seen: _records.Seen) -> bool:
        """Remove one dead file of this user's (or any, as root); whether it was removed."""
        why = _records.remove_dead(fd, seen)
        label = seen.problem or "dead holder"
        if why is None:  # each named: gc reports (and counts) every file it removed
            where = printable(str(folder / seen.name))
            self.removed.append(f"{where} ({label}, uid {_uid(seen.owner)})")
        elif why != _records.GONE:
            self._leave(folder, seen, f"{label} (uid {_uid(seen.owner)}); {why}")
        return why is None

    def _leave(self, folder: Path, seen: _records.Seen, why: str) -> None:
        self.left += 1
        if self.left <= LEFT_SHOWN:
            self.problems.append(f"{printable(str(folder / seen.name))}: {why}")

    def summarise(self, folder: Path) -> None:
        """Close one folder: count the dead files left beyond LEFT_SHOWN."""
        if self.left > LEFT_SHOWN:
            self.problems.append(
                f"{printable(str(folder))}: and {self.left - LEFT_SHOWN} more files no one holds "
                "(left: another user's, or a read-only scan; root's `memgov gc` removes them)"
            )
        self.left = 0


def _uid(uid: int | None) -> str:
    return "?" if uid is None else str(uid)


STOPPED_WAITER_S = 5.0
"""A queue ticket its waiter has not touched for this long is passed over: a waiter touches its
ticket at every look (at least every 50 ms, _admission), so one that has not for 5 s does not
run: stopped (SIGSTOP), or the host has not given it a moment in all that time. Once it runs
again it sees the time it lost and joins the queue again at its end (_admission)."""


def _passed_over(folder_fd: int, name: str, before: float) -> bool:
    """Whether the ticket ``name`` was last touched before ``before`` (time.time()). Its owner
    alone (or root) sets a file's times: no other user can make a waiter look stopped."""
    try:
        return os.stat(name, dir_fd=folder_fd, follow_symlinks=False).st_mtime < before
    except OSError:
        return False  # gone: its removal is what the waiters behind it wake for


class QueuePlace:
    """Whether a queue ticket is first among the live tickets, checked without the admission lock.

    A waiter that is not first cannot be admitted, so it only watches the ticket just ahead of it
    (one open and one lock probe) instead of contending for the admission lock with everyone.
    """

    RELIST_EVERY = 25
    """Polls between full re-reads of the queue (these also catch a fork-held dead ticket)."""

    def __init__(self, ledger: DeviceLedger, mine: str) -> None:
        self.ledger = ledger
        self.mine = mine
        self.ahead: str | None = None
        self.polls = 0
        self._folder: select.epoll | None = None
        """queue/ as the last re-read opened it (checked from /, _trust): the quick looks probe
        the ticket ahead in it. A walk from / at every poll of 64 waiters took more CPU than the
        admissions they waited for on 2 cores. gc's rebuild of the folder moves the ticket out
        of this one, which the next probe finds gone and re-reads."""

    def first(self) -> bool:
        self.polls += 1
        stopped = time.time() - STOPPED_WAITER_S
        ahead, folder = self.ahead, self._folder
        if ahead is not None and folder is not None and self.polls % self.RELIST_EVERY:
            fd = folder.fileno()
            if _records.is_locked(fd, ahead) and not _passed_over(fd, ahead, stopped):
                return False
        self.ahead = None
        parts = (*self.ledger.parts, "queue")
        with _flock.open_dir(self.ledger.root, parts, create=False) as fd:
            self.close()
            # Duplicated and adopted in one C call: an interrupt in between leaks nothing.
            self._folder = next(map(select.epoll.fromfd, map(os.dup, (fd,))))
            try:
                names = os.listdir(fd)
            except OSError as exc:
                raise LedgerError(f"cannot list {self.ledger.path / 'queue'}: {exc}") from None
            older = sorted(n for n in names if _records.RECORD_NAME.match(n) and n < self.mine)
            for name in reversed(older):
                seen = _records._read(fd, name)
                data = seen.data if seen is not None and seen.alive else None
                uuid = self.ledger.device.uuid
                waiter = data is not None and data["device"] == uuid and data["kind"] == "waiter"
                if waiter and not _passed_over(fd, name, stopped):
                    self.ahead = name
                    return False
        return True

    def close(self) -> None:
        folder, self._folder = self._folder, None
        if folder is not None:
            folder.close()
