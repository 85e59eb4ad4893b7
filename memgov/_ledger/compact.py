"""Rebuild a claims folder that a flood left large: its size is paid by every listing after.

A folder's entries live in blocks that ext4 (and xfs) never give back when the entries go:
once another user has planted 100,000 files in ``claims/``, every listing of it reads some 6 MB
of mostly empty blocks, even after root's gc has removed them all (with 2,000 names in it: 1.79
ms a listing against 0.70 for a folder that never held more, and 0.71 once rebuilt;
results/cpu-2core/2026-11-28-folder-bloat.txt). Each claim lists ``claims/`` two or three
times, so the flood's cost would stay after the flood.

Only a new folder is small again, so root's gc (or the ledger's owner's) rebuilds a bloated
``claims/`` under the device's admission lock: a new folder, a hard link in it to every file there
that can be a live record (a regular file with a record's name, an empty one too: its holder may be
rewriting it in place; the same inode, so the same flock, the holder's lock never drops), every
folder a user planted moved into it as it is, then one atomic exchange of the two (renameat2
RENAME_EXCHANGE), and the carried records' old names unlinked. Why that is safe: records are added
and rewritten in ``claims/`` only under the admission lock (so none arrives while the links are
made, and none is rewritten before the old names are gone); a release takes no lock, and one that
resolved the old folder unlinks its name there (or finds it gone): the link in the new folder is
then a file no one locks, dead like any released record. The old folder is left readable but closed
to writes (0755) and emptied by a later gc, outside the lock, one level deep (no folder entered, no
link followed), once no scan can still be reading it (``STALE_S``). Where the filesystem cannot
exchange two folders, or any step fails, everything is put back as it was.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import stat
import time
from collections.abc import Callable

from memgov._ledger import deadnames as _deadnames, records as _records

COMPACT_AT_BYTES = 1 << 20
"""A claims folder whose own size reaches this (about 14,000 names' worth of blocks) is rebuilt
when it is also mostly empty (SPARSE_FACTOR); an honest host never gets near it."""
SPARSE_FACTOR = 8
"""Rebuilt only when the folder is this many times larger than its entries need (NAME_BYTES
each): a folder that is full is not made smaller by a rebuild."""
NAME_BYTES = 64
"""Room one record's entry takes in a folder's blocks, generously (ext4: 8 + 36 bytes)."""
OLD_PREFIX = ".compacted-"
"""The name an old folder is left under, beside the new one, until a later gc removes it."""
STALE_S = 60.0
"""How old an old folder must be before gc removes it: a scan lasts far less."""
_RENAME_EXCHANGE = 2


def bloated(folder: os.stat_result, names: int) -> bool:
    """Whether a folder of ``names`` entries is worth rebuilding (see the module doc)."""
    size = folder.st_size
    return size >= COMPACT_AT_BYTES and size >= SPARSE_FACTOR * NAME_BYTES * max(names, 1)


def compact(device_fd: int, section: str) -> int | None:
    """Rebuild ``section`` (a folder in the open device folder) if it is bloated:
    call under the device's admission lock, as the folder's owner or root. The number of records
    carried over, or None when nothing changed (not bloated, not ours, the filesystem cannot
    exchange folders, or any step failed: a rebuild only saves time, it never fails gc)."""
    exchange = _renameat2()
    if exchange is None:
        return None
    try:
        info = os.stat(section, dir_fd=device_fd, follow_symlinks=False)
        if not stat.S_ISDIR(info.st_mode) or not _may_rebuild(info):
            return None
        old_fd = os.open(section, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=device_fd)
    except OSError:
        return None
    try:
        if not bloated(os.fstat(old_fd), len(os.listdir(old_fd))):
            return None
        fresh = f"{OLD_PREFIX}{section}-{time.time_ns()}"
        os.mkdir(fresh, 0o700, dir_fd=device_fd)
    except OSError:
        os.close(old_fd)
        return None
    try:
        new_fd = os.open(fresh, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=device_fd)
    except OSError:
        with contextlib.suppress(OSError):
            os.rmdir(fresh, dir_fd=device_fd)
        os.close(old_fd)
        return None
    moves = _Moves(old_fd, new_fd)
    try:
        # What this process's scans just found dead for good (gc's sweep: the flood) is no
        # one's record: not looked at again, under the lock.
        moves.fill(_deadnames.known((info.st_dev, info.st_ino), store=False))
        if os.geteuid() == 0:
            os.fchown(new_fd, info.st_uid, info.st_gid)
        os.fchmod(new_fd, stat.S_IMODE(info.st_mode))
        if exchange(device_fd, fresh.encode(), device_fd, section.encode(), _RENAME_EXCHANGE):
            raise OSError("the filesystem cannot exchange two folders")
    except OSError:
        moves.undo()  # the old folder as it was, the new one gone
        with contextlib.suppress(OSError):
            os.rmdir(fresh, dir_fd=device_fd)
        return None
    else:
        # ``fresh`` names the old folder now. Each carried record's old name goes (no name there
        # may outlive its record's updates, which land in the new folder); others may still
        # read what is left, no one may add to it; a later gc removes it (``remove_old``).
        moves.forget_carried()
        with contextlib.suppress(OSError):
            os.fchmod(old_fd, 0o755)
        return len(moves.linked)
    finally:
        os.close(new_fd)
        os.close(old_fd)


class _Moves:
    """What a rebuild put in the new folder: links to records, other users' folders moved."""

    def __init__(self, old_fd: int, new_fd: int) -> None:
        self.old_fd, self.new_fd = old_fd, new_fd
        self.linked: list[str] = []
        self.moved: list[str] = []

    def fill(self, dead: set[str]) -> None:
        """A hard link to every possible live record (a regular file with a record's name, not
        one of ``dead``: its content says nothing while its lock may be held), and every folder
        moved as it is (a user's folder stays in the folder the user made it in; the old one
        then holds files alone). Raises OSError when one cannot be carried (what was done is
        undone by :meth:`undo`)."""
        with os.scandir(self.old_fd) as entries:
            for entry in entries:
                name = entry.name
                try:
                    if entry.is_dir(follow_symlinks=False):
                        os.rename(name, name, src_dir_fd=self.old_fd, dst_dir_fd=self.new_fd)
                        self.moved.append(name)
                    elif name not in dead and _records.RECORD_NAME.match(name):
                        file = entry.stat(follow_symlinks=False)
                        if stat.S_ISREG(file.st_mode):
                            os.link(
                                name,
                                name,
                                src_dir_fd=self.old_fd,
                                dst_dir_fd=self.new_fd,
                                follow_symlinks=False,
                            )
                            self.linked.append(name)
                except FileNotFoundError:
                    continue  # released (or removed) meanwhile

    def undo(self) -> None:
        for name in self.moved:
            with contextlib.suppress(OSError):
                os.rename(name, name, src_dir_fd=self.new_fd, dst_dir_fd=self.old_fd)
        for name in self.linked:
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=self.new_fd)

    def forget_carried(self) -> None:
        for name in self.linked:
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=self.old_fd)


def remove_old(device_fd: int) -> list[str]:
    """Remove the old folders earlier rebuilds left in the open device folder (made STALE_S ago
    or more, by the time in their names): call without the admission lock. Their names, those
    that went; one still holding a folder (planted after the rebuild had looked) stays."""
    removed: list[str] = []
    try:
        listed = os.listdir(device_fd)
    except OSError:
        return removed
    for name in listed:
        made_ns = name.rsplit("-", 1)[-1]
        if not name.startswith(OLD_PREFIX) or not made_ns.isdigit():
            continue
        if time.time() - int(made_ns) / 1e9 < STALE_S:
            continue
        with contextlib.suppress(OSError):
            info = os.stat(name, dir_fd=device_fd, follow_symlinks=False)
            if stat.S_ISDIR(info.st_mode) and _may_rebuild(info):
                _empty_out(device_fd, name)
                os.rmdir(name, dir_fd=device_fd)
                removed.append(name)
    return removed


def _empty_out(device_fd: int, name: str) -> None:
    """Unlink every file in folder ``name``: one level, no link followed, no folder entered."""
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=device_fd)
    try:
        with os.scandir(fd) as entries:
            for entry in entries:
                if not entry.is_dir(follow_symlinks=False):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.name, dir_fd=fd)
    finally:
        os.close(fd)


def _may_rebuild(info: os.stat_result) -> bool:
    return os.geteuid() in (0, info.st_uid)


_exchange: list[Callable[..., int] | None] = []
"""libc's renameat2 once looked up (None: there is none)."""


def _renameat2() -> Callable[..., int] | None:
    """libc's renameat2, or None where there is none (an old C library, not Linux)."""
    if not _exchange:
        try:
            function = ctypes.CDLL(None, use_errno=True).renameat2  # the C library loaded
        except (OSError, AttributeError):
            _exchange.append(None)
        else:
            function.argtypes = [
                ctypes.c_int,
                ctypes.c_char_p,
                ctypes.c_int,
                ctypes.c_char_p,
                ctypes.c_uint,
            ]
            function.restype = ctypes.c_int
            _exchange.append(function)
    return _exchange[0]
