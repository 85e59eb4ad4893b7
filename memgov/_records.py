"""Claim records: small JSON files whose holder keeps an exclusive flock on them for life.

The flock is the liveness signal. The kernel drops it when the holder dies, by any signal and in any
PID namespace or container that shares the file's inode, so a dead holder's record is recognised at
once, with no PID, heartbeat or daemon. A record is written to a temporary name, locked, and only
then renamed into place, so no reader ever sees an unlocked record of a live holder. Records are
never edited in place: an update is a new locked file renamed over the old one.

Every path is walked with O_NOFOLLOW relative to an open folder, so a symlink planted in a shared
folder is refused instead of followed. Readers open records read-only: probing another user's
record needs no write permission and never alters it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memgov._errors import LedgerError
from memgov._flock import flock_error

SUFFIX = ".json"
TMP_PREFIX = ".tmp-"
MAX_BYTES = 64 * 1024
SHARED_DIR_MODE = 0o1777
"""Folders are shared by every user on the host; the sticky bit keeps others' files safe."""
RECORD_MODE = 0o644

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_REQUIRED: dict[str, type | tuple[type, ...]] = {
    "version": int,
    "id": str,
    "kind": str,
    "device": str,
    "bytes": int,
    "name": str,
    "pid": int,
    "created": (int, float),
}


@contextlib.contextmanager
def open_dir(root: Path, parts: tuple[str, ...], create: bool) -> Iterator[int]:
    """Yield a descriptor of root/parts..., refusing symlinks at every level memgov owns."""
    try:
        fd = os.open(root, _DIR_FLAGS)
    except FileNotFoundError:
        if not create:
            raise
        _mkdir_parents(root)
        _mkdir_shared(None, str(root))
        fd = os.open(root, _DIR_FLAGS)
    except OSError as exc:
        raise LedgerError(_explain(root, exc)) from None
    try:
        for part in parts:
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                _mkdir_shared(fd, part)
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                raise LedgerError(_explain(root.joinpath(part), exc)) from None
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def _mkdir_parents(root: Path) -> None:
    """Make MEMGOV_DIR's missing parents, like ``mkdir -p`` (a fresh machine or container has no
    /tmp/jobs of ``MEMGOV_DIR=/tmp/jobs/ledger``); they get the umask's mode, only the ledger
    folder itself is shared (1777)."""
    try:
        root.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise LedgerError(_explain(root.parent, exc)) from None


def _mkdir_shared(dir_fd: int | None, name: str) -> None:
    try:
        os.mkdir(name, SHARED_DIR_MODE, dir_fd=dir_fd)
    except FileExistsError:
        return  # another process made it first
    except OSError as exc:
        raise LedgerError(_explain(Path(name), exc)) from None
    with contextlib.suppress(OSError):  # the umask trimmed the mode; a failure leaves it private
        os.chmod(name, SHARED_DIR_MODE, dir_fd=dir_fd, follow_symlinks=False)


def _explain(path: Path, exc: OSError) -> str:
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        return f"ledger folder {path} is a symlink or not a folder; memgov never follows symlinks"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return (
            f"no permission for ledger folder {path}; it must be writable by every user that "
            "claims GPUs (mode 1777, like /tmp) or set MEMGOV_DIR to a folder you can write"
        )
    return f"ledger folder {path}: {exc.strerror or exc}"


@dataclass
class Held:
    """A record this process holds: its lock lives as long as ``fd`` is open."""

    folder: Path
    name: str
    fd: int

    @property
    def path(self) -> Path:
        return self.folder / self.name


def create(folder_fd: int, folder: Path, name: str, payload: dict[str, Any]) -> Held:
    """Write ``payload`` as record ``name``, locked before it becomes visible."""
    return Held(folder, name, _write_locked(folder_fd, folder, name, payload))


def replace(folder_fd: int, held: Held, payload: dict[str, Any]) -> None:
    """Swap the content of a held record atomically; the lock is never dropped in between."""
    new_fd = _write_locked(folder_fd, held.folder, held.name, payload)
    old_fd, held.fd = held.fd, new_fd
    os.close(old_fd)


def release(folder_fd: int, held: Held) -> None:
    """Remove a held record, then drop its lock (in that order, so no reader sees it dead)."""
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(held.name, dir_fd=folder_fd)
    finally:
        os.close(held.fd)  # also when the unlink failed: a dead record is GC's, a held one leaks


def _write_locked(folder_fd: int, folder: Path, name: str, payload: dict[str, Any]) -> int:
    data = json.dumps(payload, sort_keys=True).encode()
    tmp = TMP_PREFIX + name
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, RECORD_MODE, dir_fd=folder_fd)
    try:
        try:
            # Blocking: a scanner may be probing this new file with a shared lock right now (it
            # lists temporary files too); that probe lasts microseconds. With LOCK_NB the claim
            # failed then, about once in 30 runs of the churn test.
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as exc:
            raise flock_error(folder / tmp, exc) from None
        os.fchmod(fd, RECORD_MODE)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
        os.replace(tmp, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=folder_fd)
        os.close(fd)
        raise
    return fd


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


def scan(folder_fd: int) -> list[Seen]:
    """Read every record in a folder; probe each one's lock. Never raises for a bad file (a
    LedgerError only for a filesystem that cannot lock at all)."""
    seen = []
    for name in sorted(os.listdir(folder_fd)):
        if name.startswith(TMP_PREFIX):
            item = _probe_tmp(folder_fd, name)
        else:
            item = _read(folder_fd, name)
        if item is not None:
            seen.append(item)
    return seen


def _probe_tmp(folder_fd: int, name: str) -> Seen | None:
    # A temporary file is locked by its writer; unlocked, its writer died before the rename.
    item = _read(folder_fd, name, parse=False)
    if item is None or item.alive:
        return None
    return Seen(name, False, None, "unfinished write of a dead process", item.owner, item.inode)


def _read(folder_fd: int, name: str, parse: bool = True) -> Seen | None:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     dir_fd=folder_fd)
    except FileNotFoundError:
        return None  # released while we listed
    except OSError as exc:
        why = "a symlink (not followed)" if exc.errno == errno.ELOOP else f"unreadable ({exc})"
        return Seen(name, False, None, why, _owner(folder_fd, name))
    try:
        info = os.fstat(fd)
        inode = (info.st_dev, info.st_ino)
        if not stat.S_ISREG(info.st_mode):
            return Seen(name, False, None, "not a regular file", info.st_uid, inode)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            alive = False
        except BlockingIOError:
            alive = True
        except OSError as exc:  # not a busy lock: the filesystem cannot lock at all (or failed)
            raise flock_error(Path(name), exc) from None
        if not parse:
            return Seen(name, alive, None, None, info.st_uid, inode)
        if not name.endswith(SUFFIX):
            return Seen(
                name, alive, None, "not a memgov record (unknown name)", info.st_uid, inode
            )
        if info.st_size > MAX_BYTES:
            return Seen(
                name, alive, None, f"too large ({info.st_size} bytes)", info.st_uid, inode
            )
        raw = os.read(fd, MAX_BYTES + 1)
    finally:
        os.close(fd)
    data, problem = _parse(raw)
    return Seen(name, alive, data, problem, info.st_uid, inode)


def _parse(raw: bytes) -> tuple[dict[str, Any] | None, str | None]:
    try:
        data = json.loads(raw.decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return None, f"corrupt JSON ({exc})"
    if not isinstance(data, dict):
        return None, "not a JSON object"
    for key, kind in _REQUIRED.items():
        value = data.get(key)
        if not isinstance(value, kind) or isinstance(value, bool):
            return None, f"field {key!r} missing or of the wrong type"
    if data["version"] != 1:
        return None, f"record version {data['version']} (this memgov reads version 1)"
    if data["bytes"] <= 0:
        return None, "field 'bytes' is not positive"
    return data, None


def _owner(folder_fd: int, name: str) -> int | None:
    try:
        return os.stat(name, dir_fd=folder_fd, follow_symlinks=False).st_uid
    except OSError:
        return None


GONE = "gone"
"""remove_dead's answer when the file already vanished or was replaced: nothing to report."""


def remove_dead(folder_fd: int, seen: Seen) -> str | None:
    """Delete a file found dead; None when removed, else why not (GONE, or e.g. another user's
    file in a sticky folder)."""
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
