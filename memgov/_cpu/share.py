"""Who shares the CPU: one small flock-held record per governed process, and each one's share.

    $MEMGOV_DIR/v1/cpu/<arrival>-<random>.json   one per governed process, held for its life

Like a claim record (memgov/_ledger/records.py), the file is written under a temporary name, locked,
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
import os
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memgov._base import config as _config
from memgov._base.errors import LedgerError
from memgov._cpu.cpus import Usable
from memgov._files import flock as _flock
from memgov._ledger import deadnames as _deadnames, records as _records
from memgov._ledger.attribution import pidns_of

PARTS = (_records.VERSION_DIR, "cpu")
"""The CPU-share folder (a simulated GPU may not take its name: _settings.RESERVED_NAMES)."""


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
        self._writing = threading.Lock()
        """One update at a time: the follower thread and the main thread (the claim naming its
        holder, the user taking over the threads) both update, each from the last payload."""

    @property
    def name(self) -> str:
        return self.held.name

    def update(self, **changes: Any) -> None:
        """Swap the record's content (e.g. its current thread count); the lock never drops."""
        with self._writing:
            payload = {**self.payload, **changes}
            before = self.held.file
            try:
                with _flock.open_dir(self.root, PARTS, create=False) as fd:
                    _records.replace(fd, self.held, payload)  # held for life still (_flock)
            finally:
                if self.held.file is not before:  # the record is the new one, interrupted or not
                    self.payload = payload

    def close(self) -> None:
        with contextlib.suppress(OSError, LedgerError):
            with _flock.open_dir(self.root, PARTS, create=False) as fd:
                _records.release(fd, self.held)
            return
        with contextlib.suppress(OSError):
            self.held.file.close()


def register(
    usable: Usable, threads: int | None, source: str, holder: str, why: str = ""
) -> Registration:
    payload = {
        "version": _records.VERSION,
        "kind": "cpu",
        "pid": os.getpid(),
        "pidns": pidns_of(),
        "host": socket.gethostname(),
        "created": time.time(),
        **_records.writer(),
        "cpus": sorted(usable.cpus),
        "quota_key": usable.quota.key if usable.quota else None,
        "threads": threads,
        "source": source,
        "holder": holder,
        "why": why,
    }
    root = _config.ledger_dir()
    with _flock.open_dir(root, PARTS, create=True) as fd:
        held = _records.create(fd, root.joinpath(*PARTS), _records.new_record_name(), payload)
    _flock.held_for_life(held)  # the process's CPU record, by design (not a leaked lock)
    return Registration(held, payload, root)


def peers(clean: bool = True, root: Path | None = None) -> list[Peer]:
    """Every live governed process in this ledger (``root``, default MEMGOV_DIR), in arrival
    order. A dead process's record is removed where this user may (``clean``); a file that is
    not a good record is skipped. Only records whose holder is verified count: the process the
    record names is alive in this PID namespace and runs as the file's owner (a record anyone
    can plant must not shrink everyone's share), one record per process."""
    root = root or _config.ledger_dir()
    try:
        with _flock.open_dir(root, PARTS, create=False) as fd:
            return _scan(fd, root, clean)
    except FileNotFoundError:
        return []


RELIST_EVERY = 10
"""Scans between full listings while the folder looks unchanged (coarse timestamps)."""
_last: dict[str, Any] = {}
"""The previous scan of this process: the folder's identity and times, and the live records.
While the folder is unchanged (no record made or removed), only those are probed again: an idle
governed process's follower then costs O(live records), whatever else lies in the folder."""


def _scan(fd: int, root: Path, clean: bool) -> list[Peer]:
    folder = root.joinpath(*PARTS)
    info = os.fstat(fd)
    key = (info.st_dev, info.st_ino, info.st_mtime_ns, info.st_ctime_ns, os.getpid())
    if _last.get("key") == key and _last.get("scans", 0) % RELIST_EVERY:
        # Unchanged folder: the live records only (each read as a full scan reads it).
        listed = [
            _records._read(fd, name, folder=folder, kind=_records.CPU) for name in _last["live"]
        ]
        seen = [item for item in listed if item is not None]
    else:
        # A full scan: names this user's processes found dead for good before are skipped
        # (_deadnames), so a flood of them costs a listing, not a stat each.
        seen = _records.scan(fd, folder, remember=clean, kind=_records.CPU, root=root)
        if clean:
            _deadnames.flush()  # outside any lock: for this user's other and later processes
    found = []
    pids: set[int] = set()
    own_ns = _records._own_pidns()
    for item in seen:
        if not item.alive:
            if clean and item.name:
                _remove_dead(fd, item)
            continue
        peer = _peer(item.name, item.data)
        if peer is None or peer.pid in pids or not _verified(peer, item.data, item.owner, own_ns):
            continue
        pids.add(peer.pid)
        found.append(peer)
    _last.update(key=key, live=[p.record for p in found], scans=_last.get("scans", 0) + 1)
    return found


def _remove_dead(fd: int, item: _records.Seen) -> None:
    """Remove a dead record where this user may (another user's is left without trying: a
    flood costs no unlink each); an unfinished write only once it is stale."""
    if os.geteuid() not in (0, item.owner):
        return
    if item.name.startswith(_flock.TMP_PREFIX) and not _records.stale(fd, item.name):
        return
    _records.remove_dead(fd, item)


def _verified(
    peer: Peer, data: dict[str, Any] | None, owner: int | None, own_ns: int | None
) -> bool:
    """Whether the record's process is alive here and runs as the record file's owner."""
    pidns = data.get("pidns") if data is not None else None
    # A record of an older memgov has no "pidns": its PID is taken as this namespace's, and the
    # owner check below still ties it to the file's owner.
    if data is None or own_ns is None or pidns not in (None, own_ns) or peer.pid <= 0:
        return False
    if not _flock.process_alive(peer.pid, _records.start_of(data)):
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
    root = root or _config.ledger_dir()
    try:
        with _flock.open_dir(root, PARTS, create=False) as fd:
            gone = 0
            for item in _records.scan(fd, root.joinpath(*PARTS), sweep=True, kind=_records.CPU):
                young = item.name.startswith(_flock.TMP_PREFIX) and not _records.stale(
                    fd, item.name
                )
                folder_like = item.problem == "not a regular file" and _flock.is_dir(fd, item.name)
                if item.name and not item.alive and not young and not folder_like:
                    gone += _records.remove_dead(fd, item) is None
            return gone
    except FileNotFoundError:
        return 0


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
