"""Names in a records folder that are nobody's live record, for good: what a scan need not open.

A scan (memgov/_ledger/records.py) lists a shared folder and looks only at names it does not know to
be dead. A name goes in here only on a verdict that holds forever (``Seen.final``), which rests on
how an honest writer uses names (_records._write_locked, replace, release):

- a record's name is new: nanoseconds and 48 random bits, never chosen again, never guessable;
- from the moment the name exists until its holder is done with it, the name points at a regular
  file that the holder keeps locked: the file is locked before the rename that gives it the
  name; an update renames a new locked file over the name before the old one is closed; a
  release unlinks the name before it drops the lock;
- once its holder is done with a name (released, died), no honest process uses it again.

So one moment at which the name points at something else (a folder, a FIFO, a link, a file no
one locks) proves the name is not, and will never be, a live record's: another user cannot make
this user's view of any *other* name wrong. What a locked file holds proves nothing: a holder
that rewrites its record in place (not memgov's way, but its lock is held throughout) shows an
empty or torn file for a moment, so such a file is live (of unknown size: it blocks), never
remembered. Nor is a locked record whose holder looks gone (a child forked from C that kept a
dead parent's lock): dead for one scan, looked at again by the next.
The moment must be one look at one file: an unlocked file counts only while the scan still
holds it open and the name still points at it (an inode cannot be reused while open); one read
before an update's rename and a probe after its close would otherwise see a live name's old,
unlocked file (_records._pinned). A file this user cannot open is judged from the host's lock
table, read before its stat, and only once older than the table by STALE_S (_records._unreadable).

The names are kept per folder (its device and inode) in memory, and between processes in this
user's private store (memgov/_files/flock.py private_folder: ``_profiles/<uid>/``, 0700, owned
by the user and checked), so that a new process does not look again at every file of another
user's flood: it reads one file of names instead. Only this user's own file is read; a file
that cannot be read is worth nothing and costs nothing but the looks it would have saved. It is
written without fsync (a cache: lost or empty after a crash, nothing is wrong) and only outside
the admission lock (``flush``).

The store is a log: each flush appends the names learned since the last one (O_APPEND, one
write), and each reader reads only what was appended since its last read (whole lines only: an
append seen half-way is read at the next). So one process's verdicts reach the others at once
and for a few bytes each: the next claimer in the queue does not judge a wave of another user's
files again (each of them did, before the log: a store rewritten whole every 64 names and read
whole). When the log outgrows the folder's dead names (COMPACT_BYTES, and four times their
size), the next flush rewrites it with the names still in the folder (a new file: readers
start it from the top). Two appends never interleave (O_APPEND); an append that lands on a file
being replaced is lost with it: a cache, the names are looked at again.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

Key = tuple[int, int]
"""A folder's (st_dev, st_ino)."""

RELOAD_AT = 64
"""Unknown names in one listing that make a scan read the store first (others may know them)."""
MAX_BYTES = 64 * 2**20
"""The largest store file read (about 1.7 million names)."""
LINE_BYTES = 39
"""One stored name: a record's name (20 digits, "-", 12 hex digits, ".json") and its newline."""
COMPACT_BYTES = 256 * 2**10
"""A log at least this large, and four times the size of the names it needs, is rewritten."""
PREFIX = "deadnames-v1-"
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_APPEND_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
RECORD_NAME = re.compile(r"^[0-9]{20}-[0-9a-f]{12}\.json\Z")
"""_records.RECORD_NAME, ended by \\Z: "$" would also match before a final newline."""


@dataclass
class Folder:
    names: set[str] = field(default_factory=set)
    records: set[str] = field(default_factory=set)
    """The names among ``names`` that go into the store (``storable``)."""
    pending: set[str] = field(default_factory=set)
    """Storable names learned here and not yet appended to the store."""
    inode: int | None = None
    """The store file this process read last (a new one, after a rewrite, is read whole)."""
    offset: int = 0
    """How far into that file it has read (whole lines)."""
    loaded: bool = False
    root: Path | None = None
    """The ledger the folder is in (None: MEMGOV_DIR's): its store keeps what is learned, whatever
    MEMGOV_DIR says when a background scan flushes (a thread of an earlier claim)."""


_folders: dict[Key, Folder] = {}


def known(key: Key, store: bool = True, root: Path | None = None) -> set[str]:
    """The names known dead in folder ``key``; ``store``: read this user's store on the first
    call (a read-only look, like `memgov status`, uses only what this process found itself)."""
    folder = _folders.get(key)
    if folder is None:
        if not store:
            return set()
        folder = _folders[key] = Folder(root=root)
        reload(key, root)
    return folder.names


def remembers(key: Key) -> bool:
    """Whether this process has scanned folder ``key`` (and so knows what it holds)."""
    folder = _folders.get(key)
    return folder is not None and folder.loaded


def learn(key: Key, names: set[str], listed: set[str], root: Path | None = None) -> None:
    """Record a scan: ``names`` found dead for good, ``listed`` the folder's listing (names
    gone from it are dropped: the set never outgrows the folder)."""
    folder = _folders.setdefault(key, Folder(root=root))
    folder.names &= listed
    folder.records &= listed
    new = {name for name in names - folder.names if storable(name)}
    folder.names |= names
    folder.records |= new
    folder.pending |= new
    folder.loaded = True


def storable(name: str) -> bool:
    """Whether ``name`` goes into the store: a record's name only (one line each, and nothing
    another user could shape into two lines, one of them a live record's name)."""
    return RECORD_NAME.match(name) is not None


def reload(key: Key, root: Path | None = None) -> None:
    """Merge in the names this user's other processes stored, if the store changed."""
    folder = _folders.setdefault(key, Folder(root=root))
    with contextlib.suppress(Exception), _store(folder.root) as fd:  # a cache: unreadable, unused
        _read(fd, key, folder)


def flush() -> None:
    """Append each folder's newly learned names to the store (outside the admission lock: the
    callers are a look before it, a waiter admitted before it hands over, the CPU-share scan)."""
    # list(): one C call, so another thread adding a folder meanwhile cannot break the loop
    due = [(key, f) for key, f in list(_folders.items()) if f.pending]
    if not due:
        return
    for root in {f.root for _key, f in due}:
        with contextlib.suppress(Exception), _store(root) as fd:
            for key, folder in due:
                if folder.root == root:
                    _append(fd, key, folder)


def forget() -> None:
    """Drop what this process knows (tests)."""
    _folders.clear()


def _file(key: Key) -> str:
    return f"{PREFIX}{key[0]}-{key[1]}.names"


@contextlib.contextmanager
def _store(root: Path | None) -> Iterator[int]:
    from memgov._files import flock as _flock  # the user's private store (owner, mode, no links)

    with _flock.private_folder(create=True, root=root) as (fd, _path):
        yield fd


def _read(fd: int, key: Key, folder: Folder) -> None:
    """Read what was appended since this process's last read (all of a new file)."""
    from memgov._files.flock import open_owned

    try:
        file = open_owned(_file(key), _READ_FLAGS, fd)
    except OSError:
        return
    try:
        info = os.fstat(file.fileno())
        mine = stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid()
        if not mine or info.st_size > MAX_BYTES:
            return
        # A new file (rewritten) is read whole; so is one smaller than what was read of it (a
        # rewrite whose file got the old one's inode number back).
        same = info.st_ino == folder.inode and info.st_size >= folder.offset
        start = folder.offset if same else 0
        if info.st_size == start:
            folder.inode, folder.offset = info.st_ino, start
            return
        file.seek(start)
        raw = file.read(info.st_size - start) or b""
    finally:
        file.close()
    end = raw.rfind(b"\n") + 1  # whole lines only: an append seen half-way is read next time
    # Every line is one name this user's processes wrote (only storable ones: no line of a
    # name another user shaped): read in C, not name by name.
    lines = set(raw[:end].decode("ascii", "replace").split("\n"))
    lines.discard("")
    folder.names |= lines
    folder.records |= lines
    folder.inode, folder.offset = info.st_ino, start + end
    folder.loaded = True


def _append(fd: int, key: Key, folder: Folder) -> None:
    from memgov._files.flock import open_owned

    file = open_owned(_file(key), _APPEND_FLAGS, fd, mode=0o600, writable=True)
    try:
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
            return
        needed = len(folder.records) * LINE_BYTES
        if info.st_size >= COMPACT_BYTES and info.st_size > 4 * needed:
            _rewrite(fd, key, folder)
            return
        data = "".join(f"{name}\n" for name in folder.pending).encode()
        os.write(file.fileno(), data)  # O_APPEND: one write, never interleaved with another
        folder.pending.clear()
        if info.st_ino == folder.inode and os.fstat(file.fileno()).st_size == folder.offset + len(
            data
        ):
            folder.offset += len(data)  # only ours since this process's last read: skip it
    finally:
        file.close()


def _rewrite(fd: int, key: Key, folder: Folder) -> None:
    """The log replaced by the names still in the folder (and others' appended since)."""
    from memgov._files.flock import write_atomic

    _read(fd, key, folder)
    data = "".join(f"{name}\n" for name in folder.records).encode()
    info = write_atomic(fd, _file(key), data, mode=0o600, durable=False)
    folder.inode, folder.offset = info.st_ino, info.st_size
    folder.pending.clear()
