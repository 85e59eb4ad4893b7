"""Who shares the CPU: one small flock-held record per governed process, and each one's share.

    $MEMGOV_DIR/v1/cpu/<arrival>-<random>.json   one per governed process, held for its life

Like a claim record (memgov/_records.py), the file is written under a temporary name, locked,
then renamed into place, and its holder keeps the exclusive flock until it exits: the kernel drops
it however the process ends, so a dead process stops counting at the next scan. Every governed
process has one (claims and growth-only alike; a process without a GPU budget still runs thread
pools), which is why these records are not the claim records themselves.

A process's share of threads (see :func:`share`):
- neighbours on the cores: live records whose affinity mask overlaps this process's;
- cores // neighbours, the remainder going one each to the earliest arrivals;
- if a CPU quota binds, the same split of the quota among the records of the same cgroup;
- at least 1.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memgov import _config, _flock, _parse, _records
from memgov._attribution import pidns_of
from memgov._cpus import Usable
from memgov._errors import LedgerError

PARTS = ("v1", "cpu")
MAX_BYTES = 16 * 1024
STALE_TMP_S = 60.0


@dataclass(frozen=True)
class Peer:
    """A live governed process, as its record says."""

    record: str
    pid: int
    host: str
    cpus: frozenset[int]
    quota_key: str | None
    threads: int | None
    source: str
    holder: str
    why: str = ""


class Registration:
    """This process's record; its lock lives as long as the process (or until :meth:`close`)."""

    def __init__(self, held: _records.Held, payload: dict[str, Any], root: Path) -> None:
        self.held = held
        self.payload = payload
        self.root = root
        """The ledger folder it was made in (MEMGOV_DIR may change later in this process)."""

    @property
    def name(self) -> str:
        return self.held.name

    def update(self, **changes: Any) -> None:
        """Swap the record's content (e.g. its current thread count); the lock never drops."""
        payload = {**self.payload, **changes}
        with _records.open_dir(self.root, PARTS, create=False) as fd:
            _records.replace(fd, self.held, payload)
        _flock.held_for_life(self.held.file)  # replace() swapped in a new locked file
        self.payload = payload

    def close(self) -> None:
        with contextlib.suppress(OSError, LedgerError):
            with _records.open_dir(self.root, PARTS, create=False) as fd:
                _records.release(fd, self.held)
            return
        with contextlib.suppress(OSError):
            self.held.file.close()


def register(
    usable: Usable, threads: int | None, source: str, holder: str, why: str = ""
) -> Registration:
    payload = {
        "version": 1,
        "kind": "cpu",
        "pid": os.getpid(),
        "pidns": pidns_of(),
        "host": socket.gethostname(),
        "created": time.time(),
        "cpus": sorted(usable.cpus),
        "quota_key": usable.quota.key if usable.quota else None,
        "threads": threads,
        "source": source,
        "holder": holder,
        "why": why,
    }
    root = _config.ledger_dir()
    with _records.open_dir(root, PARTS, create=True) as fd:
        name = f"{time.time_ns():020d}-{os.urandom(6).hex()}{_records.SUFFIX}"
        held = _records.create(fd, root.joinpath(*PARTS), name, payload)
    _flock.held_for_life(held.file)  # the process's CPU record, by design (not a leaked lock)
    return Registration(held, payload, root)


def peers(clean: bool = True, root: Path | None = None) -> list[Peer]:
    """Every live governed process in this ledger (``root``, default MEMGOV_DIR), in arrival
    order. A dead process's record is removed where this user may (``clean``); a file that is
    not a good record is skipped. Only records whose holder is verified count: the process the
    record names is alive in this PID namespace and runs as the file's owner (a record anyone
    can plant must not shrink everyone's share), one record per process."""
    try:
        opened = _records.open_dir(root or _config.ledger_dir(), PARTS, create=False)
        with opened as fd:
            return _scan(fd, clean)
    except FileNotFoundError:
        return []


RELIST_EVERY = 10
"""Scans between full listings while the folder looks unchanged (coarse timestamps)."""
_last: dict[str, Any] = {}
"""The previous scan of this process: the folder's identity and times, and the live records.
While the folder is unchanged (no record made or removed), only those are probed again: an idle
governed process's follower then costs O(live records), whatever else lies in the folder."""


def _scan(fd: int, clean: bool) -> list[Peer]:
    info = os.fstat(fd)
    key = (info.st_dev, info.st_ino, info.st_mtime_ns, info.st_ctime_ns, os.getpid())
    quick = _last.get("key") == key and _last.get("scans", 0) % RELIST_EVERY
    names = list(_last.get("live", [])) if quick else sorted(os.listdir(fd))
    found = []
    pids: set[int] = set()
    own_ns = _records._own_pidns()
    for name in names:
        alive, data, owner = _probe(fd, name)
        if alive is None:
            continue
        if not alive:
            tmp = name.startswith(_records.TMP_PREFIX)
            mine = os.geteuid() in (0, owner)  # another user's: no unlink tried (a flood)
            if clean and mine and (not tmp or _older_than(fd, name, STALE_TMP_S)):
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=fd)
            continue
        peer = _peer(name, data)
        if peer is None or peer.pid in pids or not _verified(peer, data, owner, own_ns):
            continue
        pids.add(peer.pid)
        found.append(peer)
    _last.update(key=key, live=[p.record for p in found], scans=_last.get("scans", 0) + 1)
    return found


def _verified(peer: Peer, data: dict[str, Any] | None, owner: int, own_ns: int | None) -> bool:
    """Whether the record's process is alive here and runs as the record file's owner."""
    pidns = data.get("pidns") if data is not None else None
    # A record of an older memgov has no "pidns": its PID is taken as this namespace's, and the
    # owner check below still ties it to the file's owner.
    if data is None or own_ns is None or pidns not in (None, own_ns) or peer.pid <= 0:
        return False
    created = data.get("created")
    if not _flock.process_alive(peer.pid, created if isinstance(created, (int, float)) else None):
        return False
    try:
        with open(f"/proc/{peer.pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"Uid:"):
                    real, effective = (int(x) for x in line.split()[1:3])
                    return owner in (real, effective)
    except (OSError, ValueError):
        return False
    return False


def sweep(root: Path | None = None) -> int:
    """Remove every file in the CPU-share folder that no process holds (gc; root may remove any
    user's). Returns how many went."""
    try:
        with _records.open_dir(root or _config.ledger_dir(), PARTS, create=False) as fd:
            gone = 0
            for name in os.listdir(fd):
                alive, _data, _owner = _probe(fd, name, sweep=True)
                young = name.startswith(_records.TMP_PREFIX) and not _older_than(
                    fd, name, STALE_TMP_S
                )
                if alive is False and not young:
                    with contextlib.suppress(OSError):
                        os.unlink(name, dir_fd=fd)
                        gone += 1
            return gone
    except FileNotFoundError:
        return 0


def _probe(
    fd: int, name: str, sweep: bool = False
) -> tuple[bool | None, dict[str, Any] | None, int]:
    """(alive, parsed content, owner uid); alive None: not a file of ours (skipped, never
    removed; with ``sweep``, any unlocked file counts as dead)."""
    ours = name.endswith(_records.SUFFIX) or name.startswith(_records.TMP_PREFIX)
    if not ours and not sweep:
        return None, None, -1
    if not sweep:
        empty = _records._empty(fd, name, sweep)
        if empty is not None:  # no record is empty: dead, known from one lstat
            return False, None, empty.owner if empty.owner is not None else -1
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        # Owned (closed in a forked child by _flock's hook): a child forked while this thread
        # holds the probe's shared lock must not keep it, e.g. on a writer's locked-to-be file.
        file = _flock.open_owned(name, flags, fd)
    except OSError as exc:
        # gone or unreadable; a symlink or a folder is no one's record (gc removes a symlink)
        return (False if sweep and exc.errno == errno.ELOOP else None), None, -1
    try:
        file_fd = file.fileno()
        info = os.fstat(file_fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_BYTES:
            return (False if sweep and not stat.S_ISDIR(info.st_mode) else None), None, -1
        try:
            fcntl.flock(file_fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                alive = True
            else:
                return None, None, -1  # a filesystem without flock: nothing can be known
        else:
            alive = False
        if not alive or name.startswith(_records.TMP_PREFIX) or sweep:
            return alive, None, info.st_uid
        raw = os.read(file_fd, MAX_BYTES + 1)
    finally:
        file.close()
    try:  # other users' files: parsed with the ledger's bounds (depth, number length, range)
        text = raw.decode()
        if _parse._depth(text) > _parse.MAX_DEPTH:
            return None, None, -1
        data = json.loads(
            text,
            parse_int=_parse._bounded_int,
            parse_float=_parse._bounded_float,
            parse_constant=_parse._no_constant,
        )
    except (UnicodeDecodeError, ValueError, RecursionError, OverflowError):
        return None, None, -1
    return True, data if isinstance(data, dict) else None, info.st_uid


def _peer(name: str, data: dict[str, Any] | None) -> Peer | None:
    if data is None or data.get("kind") != "cpu":
        return None
    cpus = data.get("cpus")
    pid = data.get("pid")
    if not isinstance(cpus, list) or not all(isinstance(c, int) for c in cpus):
        return None
    if not isinstance(pid, int):
        return None
    threads = data.get("threads")
    quota_key = data.get("quota_key")
    return Peer(
        record=name,
        pid=pid,
        host=str(data.get("host", "")),
        cpus=frozenset(cpus),
        quota_key=quota_key if isinstance(quota_key, str) else None,
        threads=threads if isinstance(threads, int) and not isinstance(threads, bool) else None,
        source=str(data.get("source", "")),
        holder=str(data.get("holder", "")),
        why=str(data.get("why", "")),
    )


def _older_than(fd: int, name: str, seconds: float) -> bool:
    try:
        return time.time() - os.stat(name, dir_fd=fd, follow_symlinks=False).st_mtime > seconds
    except OSError:
        return False


@dataclass(frozen=True)
class Share:
    threads: int
    neighbours: int
    """Governed processes on these cores, this one included."""
    quota_neighbours: int | None
    """Governed processes under the same CPU quota, this one included; None without a quota."""

    def describe(self, usable: Usable) -> str:
        text = f"{usable.count} usable core(s) / {self.neighbours} governed process(es) on them"
        if self.quota_neighbours is not None and self.quota_neighbours != self.neighbours:
            text += f" ({self.quota_neighbours} under the same CPU quota)"
        return text


def share(usable: Usable, live: list[Peer], me: str | None) -> Share:
    """This process's threads, given the live records (``me``: its own record's name, or None
    when it has none yet: it is then counted as the last arrival)."""
    on_cores = [p.record for p in live if p.cpus & usable.cpus or p.record == me]
    if me is None or me not in on_cores:
        on_cores.append(me or "~")  # "~" sorts after every record name: the newest arrival
    threads = _split(len(usable.cpus), sorted(on_cores), me or "~")
    quota_n = None
    if usable.quota is not None:
        key = usable.quota.key
        same = [p.record for p in live if p.quota_key == key or p.record == me]
        if me is None or me not in same:
            same.append(me or "~")
        quota_n = len(same)
        cap = max(1, usable.count)
        threads = min(threads, _split(cap, sorted(same), me or "~"))
    return Share(max(1, threads), len(on_cores), quota_n)


def _split(cores: int, order: list[str], me: str) -> int:
    n = max(1, len(order))
    rank = order.index(me)
    return cores // n + (1 if rank < cores % n else 0)
