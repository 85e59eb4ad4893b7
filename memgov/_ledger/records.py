"""Claim records: small JSON files whose holder keeps an exclusive flock on them for life.

The flock is the liveness signal. The kernel drops it when the holder dies, by any signal and in any
PID namespace or container that shares the file's inode, so a dead holder's record is recognised at
once, with no PID, heartbeat or daemon. A record is written to a temporary name, locked, and only
then renamed into place, so no reader ever sees an unlocked record of a live holder. Records are
never edited in place: an update is a new locked file renamed over the old one. A held lock
outweighs whatever a look at the file finds (empty, torn, a holder that looks gone): such a file
is never removed nor remembered as dead (``Seen.locked``), and no wall clock enters a verdict
(holder_alive).

Every path is walked with O_NOFOLLOW relative to an open folder, so a symlink planted in a shared
folder is refused instead of followed. Readers open records read-only: probing another user's
record needs no write permission and never alters it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import json
import os
import re
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memgov._base.errors import LedgerError
from memgov._files.flock import (
    LAYOUT_DIR,
    RECORD_MODE,
    TMP_PREFIX,
    flock_error,
    lock_table,
    open_owned,
    pid_running,
    process_alive,
    try_lock,
)
from memgov._ledger import deadnames as _deadnames
from memgov._ledger.attribution import pidns_of
from memgov._ledger.parse import CLAIM_FIELDS, CPU_FIELDS, Fields, _parse

VERSION_DIR = LAYOUT_DIR
"""The ledger's layout version: every folder memgov uses lies under MEMGOV_DIR/v1."""
VERSION = 1
"""The version field of every record (claims, queue tickets, CPU-share records, runs)."""
SUFFIX = ".json"
RECORD_NAME = re.compile(r"^[0-9]{20}-[0-9a-f]{12}\.json$")
"""What memgov names a record (:func:`new_record_name`); anything else is not one."""
STALE_TMP_S = 60.0
"""A temporary record older than this with no lock is debris of a dead writer."""
MAX_BYTES = 64 * 1024


def new_record_name() -> str:
    """A new record's name. Arrival order is the name order: nanoseconds since the epoch agree
    across the containers of one host; the random tail keeps names unique (os.urandom: what
    secrets.token_hex reads, without importing secrets and hmac in every governed process)."""
    return f"{time.time_ns():020d}-{os.urandom(6).hex()}{SUFFIX}"


def stale(folder_fd: int, name: str) -> bool:
    """Whether file ``name`` is older than STALE_TMP_S (False when it cannot be told)."""
    try:
        mtime = os.stat(name, dir_fd=folder_fd, follow_symlinks=False).st_mtime
    except OSError:
        return False
    return time.time() - mtime > STALE_TMP_S


@dataclass
class Held:
    """A record this process holds: its lock lives as long as ``file`` is open."""

    folder: Path
    name: str
    file: io.FileIO

    @property
    def path(self) -> Path:
        return self.folder / self.name


def create(folder_fd: int, folder: Path, name: str, payload: dict[str, Any]) -> Held:
    """Write ``payload`` as record ``name``, locked before it becomes visible."""
    return Held(folder, name, _write_locked(folder_fd, folder, name, payload))


def replace(folder_fd: int, held: Held, payload: dict[str, Any]) -> None:
    """Swap the content of a held record atomically; the lock is never dropped in between.

    ``held`` takes the new file as soon as it is visible, also when an interrupt lands right
    after the rename (_write_locked): otherwise the visible record would be the new file, closed
    (unlocked: dead to every reader, and gc's), while this process went on holding the old one,
    unlinked, as if its claim were still counted."""
    _write_locked(folder_fd, held.folder, held.name, payload, into=held)


def _swap(held: Held, new: io.FileIO) -> None:
    old, held.file = held.file, new
    old.close()  # an interrupt before this leaves the old, unlinked file open: it guards nothing


def release(folder_fd: int, held: Held) -> None:
    """Remove a held record, then drop its lock (in that order, so no reader sees it dead)."""
    try:
        os.unlink(held.name, dir_fd=folder_fd)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise LedgerError(f"cannot remove {held.path}: {exc.strerror or exc}") from None
    finally:
        held.file.close()  # also when the unlink failed: a dead record is GC's, a held one leaks


LOCK_TRIES_S = 2.0
"""How long a new record's writer retries its lock while a scanner probes the file."""


def _write_locked(
    folder_fd: int, folder: Path, name: str, payload: dict[str, Any], into: Held | None = None
) -> io.FileIO:
    """Write ``payload`` to a temporary name, lock it, rename it to ``name``; ``into``: the
    held record it replaces, which takes the new file the moment it is visible."""
    data = json.dumps(payload, sort_keys=True).encode()
    # A name of its own for each write: one an interrupt left behind (inside the open, before
    # memgov held the file) then blocks no later write of the record, and no other user of a
    # shared folder can make and lock it first to block them all (scans remove it, unlocked,
    # once it is a minute old).
    tmp = f"{TMP_PREFIX}{name}-{os.urandom(4).hex()}"
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    old: io.FileIO | None = None  # the file ``into`` held before, once it holds the new one
    try:
        # 0600 until locked: no other user can open it, so none can hold a lock on it first.
        file = open_owned(tmp, flags, folder_fd, mode=0o600, writable=True)
    except OSError as exc:
        raise LedgerError(f"cannot write {folder / tmp}: {exc.strerror or exc}") from None
    try:
        deadline = time.monotonic() + LOCK_TRIES_S
        # Only this user or root can open a 0600 file: a scanner's shared probe lasts
        # microseconds, so the lock is retried for a bounded time (never blocked on).
        while not try_lock(file, fcntl.LOCK_EX, folder / tmp):
            if time.monotonic() > deadline:
                raise LedgerError(f"cannot lock {folder / tmp}: another process holds it")
            time.sleep(0.0005)
        try:
            os.fchmod(file.fileno(), RECORD_MODE)
            view = memoryview(data)
            while view:
                view = view[os.write(file.fileno(), view) :]
        except OSError as exc:
            raise LedgerError(f"cannot write {folder / tmp}: {exc.strerror or exc}") from None
        if into is not None:
            # The holder takes the new file before the rename: Python runs a signal handler
            # (Ctrl-C's KeyboardInterrupt) only as os.replace returns, never between this line
            # and that call, so whatever it raises finds the holder holding the visible file.
            old, into.file = into.file, file
        try:
            # No fsync: a record means something only while its holder keeps the lock, and no
            # holder outlives a crash of the host; a torn record after one is dead (unlocked),
            # and scans remove it. A claim then never waits for the disk under the admission
            # lock (an fsync commits everyone's pending metadata, a flood's included).
            os.replace(tmp, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
        except OSError as exc:
            if into is not None and old is not None:
                into.file = old  # not renamed: the old file is the record still
            raise LedgerError(f"cannot write {folder / name}: {exc.strerror or exc}") from None
        if old is not None:
            old.close()  # an interrupt before this leaves it open, unlinked: it guards nothing
    except BaseException as exc:
        # exc itself, or an interrupt that landed in the clean-up (its context is exc)
        raise _settled(folder_fd, tmp, name, file, (into, old), exc)  # noqa: B904
    return file


SETTLE_TRIES = 100
"""How often an interrupted write's clean-up is begun again when it is itself interrupted."""


def _settled(
    folder_fd: int,
    tmp: str,
    name: str,
    file: io.FileIO,
    into: tuple[Held | None, io.FileIO | None],
    raised: BaseException,
) -> BaseException:
    """After an exception in a write, the folder and ``into`` made consistent; the exception to
    raise: the first, or the last interrupt that landed in the clean-up (a second Ctrl-C there
    restarts it rather than cutting it short; an error there never hides an interrupt)."""
    for _ in range(SETTLE_TRIES):
        try:
            _settle(folder_fd, tmp, name, file, *into)
            return raised
        except BaseException as again:
            if not isinstance(again, Exception):  # an interrupt wins over any error
                raised = again
    return raised


def _settle(
    folder_fd: int, tmp: str, name: str, file: io.FileIO, into: Held | None, old: io.FileIO | None
) -> None:
    """Python raises a signal handler's exception (Ctrl-C's KeyboardInterrupt) as soon as
    os.replace returns, so the written file may be the visible record already: then a replaced
    record's holder keeps it (closing it would leave the visible record unlocked, dead to every
    reader, while the holder kept the old, unlinked file), and a new record, whose creator never
    learns of it, is removed. Otherwise the holder keeps (or gets back) ``old`` and the temporary
    file goes. Each step may run again."""
    if _renamed(folder_fd, tmp, name, file):
        if into is not None:
            if into.file is not file:
                _swap(into, file)
            return
        if _visible(folder_fd, name, file):
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=folder_fd)
    else:
        if into is not None and old is not None and into.file is file:
            into.file = old
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=folder_fd)
    file.close()


def _renamed(folder_fd: int, tmp: str, name: str, file: io.FileIO) -> bool:
    """Whether ``file`` is the record at ``name`` now (its rename happened): told by ``name``,
    and by the temporary name only where ``name`` cannot be read (not the other way round: a
    scan removes a temporary file a minute old, as a writer stopped that long would leave it)."""
    try:
        mine = os.fstat(file.fileno())
    except (OSError, ValueError):  # closed by an earlier pass of the clean-up: nothing left
        return False
    at_name = _is(folder_fd, name, mine)
    return at_name if at_name is not None else _is(folder_fd, tmp, mine) is False


def _visible(folder_fd: int, name: str, file: io.FileIO) -> bool:
    """Whether ``name`` in the folder is ``file`` (its rename into place happened)."""
    try:
        mine = os.fstat(file.fileno())
    except (OSError, ValueError):  # the file closed already
        return False
    return _is(folder_fd, name, mine) is True


def _is(folder_fd: int, name: str, mine: os.stat_result) -> bool | None:
    """Whether ``name`` in the folder is the file ``mine`` describes: False if it is another
    or there is none, None if it cannot be read."""
    try:
        there = os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    except OSError:
        return None
    return (there.st_dev, there.st_ino) == (mine.st_dev, mine.st_ino)


@dataclass(frozen=True)
class Seen:
    """One file found in a records folder."""

    name: str
    alive: bool
    data: dict[str, Any] | None
    problem: str | None
    """Why the file was skipped (corrupt, foreign, unreadable...), or None for a good record."""
    owner: int | None
    inode: tuple[int, int] | None = None
    """(st_dev, st_ino) of the file that was read, so removal can tell it from a replacement."""
    final: bool = False
    """Dead for good: the name is not, and never will be, a live record's
    (memgov/_ledger/deadnames.py says why one look can prove that, and which looks do). Scans then
    skip it by name."""
    locked: bool = False
    """Someone holds the file's lock. Such a file is never removed and never dead for good,
    whatever its content or however its holder looks (a child forked from C that kept a dead
    parent's lock: dead for the budget, left in place until the lock goes)."""


@dataclass(frozen=True)
class Kind:
    """What a folder's records are: the fields each must have, and whether a file this user
    cannot open may be a live record that must be counted (claims and queue tickets: yes, its
    lock is looked up and a held one blocks; CPU-share records: no, one counts only once read,
    so the host's lock table is never read for them)."""

    fields: Fields
    unreadable_counts: bool


CLAIMS = Kind(CLAIM_FIELDS, unreadable_counts=True)
CPU = Kind(CPU_FIELDS, unreadable_counts=False)

NOT_RECORDS_SHOWN = 20
"""Files with names that are not memgov's named one by one in a scan; the rest are counted."""


def scan(
    folder_fd: int,
    folder: Path | None = None,
    sweep: bool = False,
    remember: bool = False,
    kind: Kind = CLAIMS,
    memo: str | None = None,
    root: Path | None = None,
) -> list[Seen]:
    """Read every record in a folder; probe each one's lock. Never raises for a bad file; a
    LedgerError when the folder cannot be read or a file's state cannot be known (EMFILE, a
    filesystem without flock): an unknown state must never count as "no claim".

    Files whose names are not memgov's are not opened (no live claim has such a name), so a
    flood of them costs a scan only their listing; ``sweep`` (gc) opens them too, so that the
    unlocked ones can be removed. There is no limit on the number of files: a limit would be a
    switch anyone could flip. ``remember``: the caller removes every dead file it may, so the
    dead ones still there next time are another user's (see ``_dead``). ``kind``: the records'
    fields and how a file this user cannot open counts (:class:`Kind`). ``memo`` (a scan that
    removes nothing): "note" what it finds dead for good, or "use" what was noted, not looking
    at those files again (:data:`_read_only_dead`)."""
    folder = folder or Path(".")
    try:
        info = os.fstat(folder_fd)
        key = (info.st_dev, info.st_ino)
        # Names only (no stat, no inode): what is known dead is known by name (_deadnames).
        listed = set(os.listdir(folder_fd))
    except OSError as exc:
        raise LedgerError(f"cannot list {folder}: {exc.strerror or exc}") from None
    # ``root``: the ledger the folder is in, whose store keeps what is learned of it
    fresh = listed if sweep else listed - _deadnames.known(key, store=remember, root=root)
    if memo == "use" and not remember:
        fresh -= _read_only_dead.get(key, set())
    new = fresh - _fresh_last.get(key, set())
    if remember and not sweep and len(new) >= _deadnames.RELOAD_AT:
        # Many names new since this process's last scan: this user's other processes may have
        # judged them. (Names the last scan saw and could not judge for good, such as a hung
        # writer's temporary files, do not count again: they would reload the store every time.)
        _deadnames.reload(key, root)
        fresh = listed - _deadnames.known(key, root=root)
    final = set()
    seen = []
    locks = LockTable()
    foreign = 0
    for name in sorted(fresh):
        if name.startswith(TMP_PREFIX):
            item = _probe_tmp(folder_fd, folder, name, locks, kind)
        elif RECORD_NAME.match(name) or sweep:
            item = _read(folder_fd, name, folder=folder, locks=locks, kind=kind)
        else:
            foreign += 1
            final.add(name)  # a name that is not a record's never becomes one
            item = None
            if foreign <= NOT_RECORDS_SHOWN:
                item = Seen(name, False, None, "not a memgov record (unknown name)", None)
        if item is not None:
            seen.append(item)
            if item.final:
                final.add(name)
    if remember:
        _deadnames.learn(key, final, listed, root)
        _fresh_last[key] = fresh - final
    elif memo == "note":
        _read_only_dead[key] = final
    if foreign > NOT_RECORDS_SHOWN:
        more = foreign - NOT_RECORDS_SHOWN
        seen.append(
            Seen(
                "",
                False,
                None,
                f"and {more} more files that are not memgov records "
                "(not opened; root's `memgov gc` removes them)",
                None,
            )
        )
    return seen


def remembers(folder_fd: int) -> bool:
    """Whether this process has scanned the folder with ``remember`` (knows its dead files)."""
    try:
        info = os.fstat(folder_fd)
    except OSError:
        return False
    return _deadnames.remembers((info.st_dev, info.st_ino))


def unjudged(folder_fd: int) -> int:
    """How many names in the folder are new to this process: neither known dead for good nor
    seen by its last scan (a listing and set operations: no file is looked at)."""
    info = os.fstat(folder_fd)
    key = (info.st_dev, info.st_ino)
    return len(set(os.listdir(folder_fd)) - _deadnames.known(key) - _fresh_last.get(key, set()))


_read_only_dead: dict[tuple[int, int], set[str]] = {}
"""Folder (device, inode) -> names that the last scan which removes nothing and notes (``memo``:
`memgov status`'s look before the admission lock) found dead for good; its look under the lock
uses them. Kept apart from the
store of dead names (_deadnames), which holds only what is left after a cleaning scan: this
user's own dead files are there too, and a cleaning scan must still find (and remove) them."""

_fresh_last: dict[tuple[int, int], set[str]] = {}
"""Folder (device, inode) -> the names this process's last remembering scan looked at and did
not find dead for good (live records, and what it could not judge for good)."""


def _probe_tmp(
    folder_fd: int, folder: Path, name: str, locks: LockTable, kind: Kind
) -> Seen | None:
    # A temporary file is locked by its writer; unlocked, its writer died before the rename.
    # One this user cannot open (another user's, still 0600) is that user's business: ignored,
    # and never looked up in the host's lock table (whatever its lock, it is no live record).
    unlooked = Kind(kind.fields, unreadable_counts=False)
    item = _read(folder_fd, name, parse=False, folder=folder, locks=locks, kind=unlooked)
    if item is None or item.alive or item.problem:
        return None
    return Seen(name, False, None, "unfinished write of a dead process", item.owner, item.inode)


_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class LockTable:
    """/proc/locks, read at most once per scan and only for a file this user cannot open (its
    lock cannot be probed): the table lists every lock on the host, and anyone can make it
    large, so liveness never reads it otherwise."""

    def __init__(self) -> None:
        self._table: dict[str, list[int]] | None = None
        self._read = False
        self.read_at = 0.0
        """When the table was read (time.time())."""

    def load(self) -> None:
        if not self._read:
            self.read_at = time.time()
            self._table, self._read = lock_table(), True

    def holders(self, dev: int, ino: int) -> list[int] | None:
        self.load()
        if self._table is None:
            return None
        return self._table.get(f"{os.major(dev):02x}:{os.minor(dev):02x}:{ino}", [])


TABLE_MARGIN_S = 2.0
"""How much older than the lock table a file this user cannot open must be for its "not
locked" verdict to be final (coarse file timestamps, a clock read a moment apart)."""


def _read(
    folder_fd: int,
    name: str,
    parse: bool = True,
    folder: Path | None = None,
    locks: LockTable | None = None,
    kind: Kind = CLAIMS,
) -> Seen | None:
    locks = locks or LockTable()
    try:
        # O_NONBLOCK: a FIFO or device planted here never blocks the open. The descriptor is
        # owned by a FileIO made in the same C call (_open_probe): no interrupt leaks it.
        probe = _open_probe(folder_fd, name)
    except FileNotFoundError:
        return None  # released while we listed
    except IsADirectoryError:  # a record is a regular file from the moment it has its name
        return Seen(name, False, None, "not a regular file", _owner(folder_fd, name), final=True)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            why = "a symlink (not followed)"
            return Seen(name, False, None, why, _owner(folder_fd, name), final=True)
        if exc.errno in (errno.EACCES, errno.EPERM):
            if not kind.unreadable_counts:  # never read, so never counted: no lock lookup
                return _not_counted(folder_fd, name, f"unreadable ({exc.strerror})")
            return _unreadable(folder_fd, name, exc, locks)
        if exc.errno in (errno.ENXIO, errno.ENODEV, errno.EISDIR):  # a socket or device: no lock
            why = f"unreadable ({exc.strerror})"
            return Seen(name, False, None, why, _owner(folder_fd, name), final=True)
        # EMFILE, ENFILE, ENOMEM, EIO...: the state of this file is unknown, so is the budget.
        where = (folder or Path(".")) / name  # only here: a path per file costs a flood's look
        raise LedgerError(f"cannot read {where}: {exc.strerror or exc}") from None
    try:
        fd = probe.fileno()
        info = os.fstat(fd)
        inode = (info.st_dev, info.st_ino)
        if not stat.S_ISREG(info.st_mode):
            return Seen(name, False, None, "not a regular file", info.st_uid, inode, final=True)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            alive = False
        except BlockingIOError:
            alive = True
        except OSError as exc:  # not a busy lock: the filesystem cannot lock at all (or failed)
            raise flock_error((folder or Path(".")) / name, exc) from None
        if not parse:
            return Seen(name, alive, None, None, info.st_uid, inode)
        # After the probe, while the file is still open: whether the name still points at it.
        pinned = _pinned(folder_fd, name, inode)
        problem = None
        if not RECORD_NAME.match(name):
            problem = "not a memgov record (unknown name)"
        elif info.st_size > MAX_BYTES:
            problem = f"too large ({info.st_size} bytes)"
        elif not info.st_size:
            # Locked, it is a record being rewritten in place by its holder: live, size unknown.
            problem = "empty" if alive else "empty (not a record)"
        else:
            try:
                raw = os.read(fd, MAX_BYTES + 1)
            except OSError as exc:
                problem = f"unreadable ({exc.strerror})"
        if problem is not None:
            final = pinned and not alive
            return Seen(name, alive, None, problem, info.st_uid, inode, final=final, locked=alive)
    finally:
        probe.close()
    data, problem = _parse(raw, kind.fields)
    locked = alive
    if alive and data is not None:
        alive = holder_alive(data)
    # Dead for good only on the lock: a locked record whose holder looks gone is dead for this
    # scan and looked at again by the next, never remembered (the store of dead names is shared
    # and lasting), and a locked one that cannot be parsed (torn, rewritten in place) is live.
    final = pinned and not locked
    return Seen(name, alive, data, problem, info.st_uid, inode, final=final, locked=locked)


def _pinned(folder_fd: int, name: str, inode: tuple[int, int]) -> bool:
    """Whether ``name`` points at the file the caller holds open (``inode``). A verdict on an
    open file is about the name only while both hold: an update renames a new locked file over
    a live record's name before its old one is closed and unlocked, so a probe of the old file
    can see it unlocked; the name then points elsewhere. While the caller holds the file open,
    its inode number cannot go to another file (_deadnames's module docstring)."""
    try:
        now = os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
    except OSError:
        return False
    return (now.st_dev, now.st_ino) == inode


def _open_probe(folder_fd: int, name: str) -> io.FileIO:
    """``name`` opened read-only, never through a link, owned by a FileIO (open_owned) that a
    forked child closes (_flock's at-fork hook): a child forked while this thread holds the
    probe's shared lock must not keep it."""
    return open_owned(name, _READ_FLAGS, folder_fd)


def _own_pidns() -> int | None:
    """This process's PID namespace, if /proc is this namespace's (else PIDs cannot be checked)."""
    try:
        if os.readlink("/proc/self") != str(os.getpid()):
            return None
    except OSError:
        return None
    return pidns_of()


def holder_alive(data: dict[str, Any]) -> bool:
    """Whether the process a locked record names is still there (the lock says someone holds
    the file; this says it is the process that took it).

    A child forked from C (no at-fork hook) keeps its parent's descriptor, and so the lock, after
    the parent died: the record names the parent, which is gone (or its PID went to a process
    that started at another tick), so the record is dead. No clock is read: a step of the wall
    clock moves the boot time /proc/stat reports, not the ticks a process started at. A PID that
    cannot be checked from here (another PID namespace, a /proc that is not this namespace's)
    counts as alive: fail closed. One read of /proc per live record, never the host's lock table.
    """
    pid, pidns = data.get("pid"), data.get("pidns")
    if not isinstance(pid, int) or pid <= 0 or pidns is None or pidns != _own_pidns():
        return True
    return process_alive(pid, start_of(data))


def writer() -> dict[str, int | None]:
    """What a record says of its writer besides its PID, so that a reader tells it from a later
    process given the same PID without any clock: ``start``, when it started, in clock ticks
    since boot (field 22 of /proc/self/stat, which no step of the wall clock moves), and
    ``timens``, its time namespace (a namespace with its own boot time shows every process's
    start shifted by it). Read once per process (its start never changes)."""
    pid = os.getpid()
    if pid not in _writer:
        start: int | None = None
        with (
            contextlib.suppress(OSError, ValueError, IndexError),
            open("/proc/self/stat", "rb") as f,
        ):
            start = int(f.read(4096).rsplit(b")", 1)[-1].split()[19])
        _writer.clear()  # a forked child's: its parent's entry is no use to it
        _writer[pid] = {"start": start, "timens": _timens()}
    return dict(_writer[pid])


_writer: dict[int, dict[str, int | None]] = {}


def start_of(data: dict[str, Any]) -> int | None:
    """The start tick a record gives its writer, where this process can compare it with
    /proc/PID/stat (the same time namespace); None where it cannot (a record of a memgov that
    wrote none, another time namespace's): its PID is then only checked to exist (fail closed)."""
    start = data.get("start")
    if not isinstance(start, int) or isinstance(start, bool) or start < 0:
        return None
    return start if data.get("timens") == _timens() else None


def _timens() -> int | None:
    """This process's time namespace (None where the kernel has none, before Linux 5.6)."""
    try:
        return os.stat("/proc/self/ns/time").st_ino
    except OSError:
        return None


def is_locked(folder_fd: int, name: str) -> bool:
    """Quick probe: whether ``name`` exists and someone holds a lock on it."""
    try:
        probe = _open_probe(folder_fd, name)
    except OSError:
        return False  # gone, or a folder (which holds no ticket)
    try:
        fcntl.flock(probe.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        probe.close()
    return False


def _unreadable(folder_fd: int, name: str, exc: OSError, locks: LockTable) -> Seen:
    """A file this user may not open. If its lock is held it may be a live claim of unknown size:
    it must block admissions (fail closed), never vanish from the count.

    Final (dead for good) only where the table was read before the stat and the file had its
    name before the table was read (its ctime, which a rename sets, older by TABLE_MARGIN_S): a
    record is locked before it is named and stays locked while it has the name and its holder
    lives, so a file named before the table was read and not in it is no live record's, now or
    later. A file named after the read may be a new record the table has not seen."""
    locks.load()  # before the stat (see above)
    try:
        info = os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
    except OSError:
        return Seen(name, True, None, f"unreadable ({exc.strerror}); state unknown", None)
    pids = locks.holders(info.st_dev, info.st_ino)
    alive = pids is None or (bool(pids) and any(pid_running(p) for p in pids))
    state = "locked or unknown" if alive else "not locked"
    inode = (info.st_dev, info.st_ino)
    final = not alive and info.st_ctime < locks.read_at - TABLE_MARGIN_S
    why = f"unreadable ({exc.strerror}), {state}"
    return Seen(name, alive, None, why, info.st_uid, inode, final=final)


def _not_counted(folder_fd: int, name: str, why: str) -> Seen:
    """A file that counts as no one's record whatever its lock (final: a record is readable by
    every user from the moment it has its name, so this name is no live one's)."""
    try:
        info = os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
    except OSError:
        return Seen(name, False, None, why, None)
    return Seen(name, False, None, why, info.st_uid, (info.st_dev, info.st_ino), final=True)


def _owner(folder_fd: int, name: str) -> int | None:
    try:
        return os.stat(name, dir_fd=folder_fd, follow_symlinks=False).st_uid
    except OSError:
        return None


NOT_MINE = "cannot remove (another user's, in a sticky folder: root's `memgov gc` removes it)"
"""Why a dead file of another user is left, said without trying (a flood costs no syscall)."""
GONE = "gone"
"""remove_dead's answer when the file already vanished or was replaced: nothing to report."""
HELD = "left: another process holds its lock (removed once that lock goes)"
"""Why a file whose lock is held is never removed, even where its holder looks gone."""


def remove_dead(folder_fd: int, seen: Seen) -> str | None:
    """Delete a file found dead; None when removed, else why not (GONE, HELD, or e.g. another
    user's file in a sticky folder). A file someone holds locked stays whatever the scan made
    of it: a removed record is gone from every later count, even if its holder lives."""
    if seen.locked:
        return HELD
    try:
        now = os.stat(seen.name, dir_fd=folder_fd, follow_symlinks=False)
        if seen.inode is not None and (now.st_dev, now.st_ino) != seen.inode:
            # replace() renamed a live record over the name after we read the old, now unlocked
            # one: the name belongs to a live holder and must not be unlinked.
            return GONE
        os.unlink(seen.name, dir_fd=folder_fd)
    except FileNotFoundError:
        return GONE
    except OSError as exc:
        return f"cannot remove ({exc.strerror})"
    return None
