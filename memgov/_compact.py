"""Rebuild a claims folder that a flood left large: its size is paid by every listing after.

A folder's entries live in blocks that ext4 (and xfs) never give back when the entries go:
once another user has planted 100,000 files in ``claims/``, every listing of it reads some 6 MB
of mostly empty blocks, even after root's gc has removed them all (with 2,000 names in it: 1.79
ms a listing against 0.70 for a folder that never held more, and 0.71 once rebuilt;
results/cpu-2core/2026-11-28-folder-bloat.txt). Each claim lists ``claims/`` two or three
times, so the flood's cost would stay after the flood.

Only a new folder is small again, so root's gc (or the ledger's owner's) rebuilds a bloated
``claims/`` under the device's admission lock: a new folder, a hard link in it to every file
there that can be a live record (a regular, non-empty file with a record's name: the same inode,
so the same flock, the holder's lock never drops), then one atomic exchange of the two
(renameat2 RENAME_EXCHANGE). Why that is safe: records are added and rewritten in ``claims/``
only under the admission lock (so none arrives while the links are made); a release takes no
lock, and one that resolved the old folder unlinks its name there: the link in the new folder
is then a file no one locks, dead like any released record. A reader that opened the old folder
before the exchange still sees every record in it (the links are left there), and the old folder
is closed to other users (0700) and removed by a later gc, once no scan can still be reading it
(``STALE_S``). Where the filesystem cannot exchange two folders, nothing changes.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import shutil
import stat
import time
from collections.abc import Callable
from pathlib import Path

from memgov import _deadnames, _records

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


def compact(device_fd: int, device: Path, section: str) -> int | None:
    """Rebuild ``section`` (a folder in the open device folder ``device``) if it is bloated:
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
        names = os.listdir(old_fd)
        if not bloated(os.fstat(old_fd), len(names)):
            return None
        # What this process's scans just found dead for good (gc's sweep: the flood) is no
        # one's record: not looked at again, under the lock.
        dead = _deadnames.known((info.st_dev, info.st_ino), store=False)
        fresh = f"{OLD_PREFIX}{section}-{time.time_ns()}"
        carried = _fill(device_fd, device / fresh, fresh, old_fd, set(names) - dead, info)
        if carried is None:
            return None
        if exchange(device_fd, fresh.encode(), device_fd, section.encode(), _RENAME_EXCHANGE):
            _remove(device / fresh)  # not exchanged (the filesystem cannot): as it was
            return None
        # ``fresh`` now names the old folder: closed to every other user, removed later.
        with contextlib.suppress(OSError):
            os.fchmod(old_fd, 0o700)
        return carried
    except OSError:
        return None
    finally:
        os.close(old_fd)


def remove_old(device_fd: int, device: Path) -> list[str]:
    """Remove the old folders earlier rebuilds left in the open device folder ``device`` (made
    STALE_S ago or more, by the time in their names); their names."""
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
        try:
            info = os.stat(name, dir_fd=device_fd, follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISDIR(info.st_mode) and _may_rebuild(info):
            _remove(device / name)
            removed.append(name)
    return removed


def _fill(
    device_fd: int, path: Path, fresh: str, old_fd: int, names: set[str], like: os.stat_result
) -> int | None:
    """Make folder ``fresh`` as ``like`` (owner, mode) with a hard link to every possible live
    record among ``names`` of the old folder; None (and no folder left) when a step fails."""
    try:
        os.mkdir(fresh, 0o700, dir_fd=device_fd)
        new_fd = os.open(fresh, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=device_fd)
    except OSError:
        _remove(path)
        return None
    try:
        carried = 0
        for name in names:
            if not _records.RECORD_NAME.match(name):
                continue
            try:
                file = os.stat(name, dir_fd=old_fd, follow_symlinks=False)
                if not stat.S_ISREG(file.st_mode) or not file.st_size:
                    continue  # never anyone's record (empty) or not a file: left behind
                os.link(name, name, src_dir_fd=old_fd, dst_dir_fd=new_fd, follow_symlinks=False)
            except FileNotFoundError:
                continue  # released meanwhile
            except OSError:
                _remove(path)  # a record that cannot be carried: the old folder stays
                return None
            carried += 1
        if os.geteuid() == 0:
            os.fchown(new_fd, like.st_uid, like.st_gid)
        os.fchmod(new_fd, stat.S_IMODE(like.st_mode))
        return carried
    except OSError:
        _remove(path)
        return None
    finally:
        os.close(new_fd)


def _remove(folder: Path) -> None:
    """Remove ``folder`` (in a device folder only its owner writes) and what is in it, never
    following a link (shutil's descriptor-based walk, which other users' folders planted inside
    cannot redirect); whatever cannot be removed stays, for a later try."""
    shutil.rmtree(folder, ignore_errors=True)


def _may_rebuild(info: os.stat_result) -> bool:
    return os.geteuid() in (0, info.st_uid)


_exchange: list[Callable[..., int] | None] = []
"""libc's renameat2 once looked up (None: there is none)."""


def _renameat2() -> Callable[..., int] | None:
    """libc's renameat2, or None where there is none (an old C library, not Linux)."""
    if not _exchange:
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            function = libc.renameat2
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
