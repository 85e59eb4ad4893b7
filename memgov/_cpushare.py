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
    not a good record is skipped."""
    try:
        opened = _records.open_dir(root or _config.ledger_dir(), PARTS, create=False)
        with opened as fd:
            return _scan(fd, clean)
    except FileNotFoundError:
        return []


def _scan(fd: int, clean: bool) -> list[Peer]:
    found = []
    for name in sorted(os.listdir(fd)):
        alive, data = _probe(fd, name)
        if alive is None:
            continue
        if not alive:
            tmp = name.startswith(_records.TMP_PREFIX)
            if clean and (not tmp or _older_than(fd, name, STALE_TMP_S)):
                with contextlib.suppress(OSError):  # another user's file in a sticky folder
                    os.unlink(name, dir_fd=fd)
            continue
        peer = _peer(name, data)
        if peer is not None:
            found.append(peer)
    return found


def _probe(fd: int, name: str) -> tuple[bool | None, dict[str, Any] | None]:
    """(alive, parsed content); alive None: not a file of ours (skipped, never removed)."""
    ours = name.endswith(_records.SUFFIX) or name.startswith(_records.TMP_PREFIX)
    if not ours:
        return None, None
    try:
        # Owned (closed in a forked child by _flock's hook): a child forked while this thread
        # holds the probe's shared lock must not keep it, e.g. on a writer's locked-to-be file.
        file = _flock.own(
            os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
        )
    except OSError:
        return None, None  # gone, a symlink, unreadable, or a folder
    try:
        file_fd = file.fileno()
        info = os.fstat(file_fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_BYTES:
            return None, None
        try:
            fcntl.flock(file_fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                alive = True
            else:
                return None, None  # a filesystem without flock: nothing can be known
        else:
            alive = False
        if not alive or name.startswith(_records.TMP_PREFIX):
            return alive, None
        raw = os.read(file_fd, MAX_BYTES + 1)
    finally:
        file.close()
    try:  # other users' files: parsed with the ledger's bounds (depth, number length, range)
        text = raw.decode()
        if _parse._depth(text) > _parse.MAX_DEPTH:
            return None, None
        data = json.loads(
            text,
            parse_int=_parse._bounded_int,
            parse_float=_parse._bounded_float,
            parse_constant=_parse._no_constant,
        )
    except (UnicodeDecodeError, ValueError, RecursionError, OverflowError):
        return None, None
    return True, data if isinstance(data, dict) else None


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
