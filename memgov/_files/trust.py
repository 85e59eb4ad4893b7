"""Who may own the folders on the ledger's path: the one set-up memgov accepts (docs/ledger.md).

The rule, like sshd's StrictModes: every folder from ``/`` down to ``MEMGOV_DIR`` and inside it
belongs to root or to this user, and
- above ``MEMGOV_DIR``, a folder others may write has the sticky bit (``/tmp``): no one else can
  move or replace what lies in it;
- ``MEMGOV_DIR`` and the folders memgov makes in it (``v1/``, device folders, ``mps/``) are not
  writable by group or others at all: no one else can make ``v1/`` first;
- only ``claims/``, ``queue/`` and ``cpu/`` are shared: writable by all, with the sticky bit.

A symlink above ``MEMGOV_DIR`` is followed only when it belongs to root or to this user (it lies
in a folder that passed the rule, so no one else can replace it); ``MEMGOV_DIR`` itself and
everything in it are never followed.

User namespaces. Where ``/proc/self/uid_map`` does not map the host's root (``unshare -r``,
rootless or userns-remapped containers), every unmapped host user shows as the overflow uid: root
and any other user look the same. memgov then trusts the overflow uid on a folder only where no
other user can have made it: a mount point (the engine mounted it: a bind-mounted ledger), or a
folder in a trusted folder that no one but its owner may write.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import select
import stat
from pathlib import Path

from memgov._base.errors import LedgerError

MAX_SYMLINKS = 40
"""As the kernel: more symlinks than this on one path is a loop."""
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
ABOVE, LEDGER, SHARED = "above", "ledger", "shared"
"""Roles of a folder: on the path above MEMGOV_DIR, memgov's own, or written by every user."""


def set_up_advice(ledger: Path | str) -> str:
    """The one admin set-up of a ledger shared by several users, as every message gives it."""
    return (
        "a ledger shared by several users is made by root once (docs/ledger.md, 'Set-ups'): "
        f"`sudo install -d -m 0755 -o root -g root {ledger}` (at boot: the systemd-tmpfiles "
        f"line `d {ledger} 0755 root root -`) then `sudo memgov gc`, best on a tmpfs of its "
        "own mounted at /run/memgov-ledger (every user's default once root made it); or set "
        "MEMGOV_DIR to a folder of your own"
    )


@functools.cache
def overflow_uid() -> int | None:
    """The uid unmapped host users (root included) show as in this user namespace; None where
    the host's root is mapped (the initial namespace, or one that maps uid 0 to 0)."""
    try:
        # Bytes, decoded by the built-in fast path: this can run while the interpreter is short
        # of codecs (a user that cannot read the encodings package, interpreter exit).
        with open("/proc/self/uid_map", "rb") as f:
            lines = [line.split() for line in f.read().decode().splitlines()]
        for _inside, outside, count in ((int(a), int(b), int(c)) for a, b, c in lines):
            if outside <= 0 < outside + count:
                return None  # the host's root is mapped: its files show a real uid
        with open("/proc/sys/kernel/overflowuid", "rb") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def mount_points() -> set[str]:
    """Mount points of this mount namespace (/proc/self/mountinfo), as paths."""
    try:
        with open("/proc/self/mountinfo", "rb") as f:
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return set()
    found = set()
    for line in text.splitlines():
        fields = line.split()
        if len(fields) > 4:
            point = fields[4]
            for code in ("\\040", "\\011", "\\012", "\\134"):
                point = point.replace(code, chr(int(code[1:], 8)))
            found.add(point)
    return found


def owner_trusted(info: os.stat_result, path: Path, parent: os.stat_result | None) -> bool:
    """Whether the folder's owner is root or this user, as far as this namespace can tell."""
    if info.st_uid in (0, os.geteuid()):
        return True
    if info.st_uid != overflow_uid():
        return False
    # An unmapped host user: root only where no one else can have made this folder.
    closed = parent is not None and not parent.st_mode & 0o022
    return closed or str(path) in mount_points()


def check(
    fd: int, path: Path, role: str, parent: os.stat_result | None, ledger: Path
) -> os.stat_result:
    """Raise LedgerError unless the open folder ``fd`` at ``path`` passes the rule for ``role``."""
    info = os.fstat(fd)
    if not owner_trusted(info, path, parent):
        raise untrusted(path, info.st_uid, "folder", ledger)
    writable = info.st_mode & 0o022
    sticky = info.st_mode & stat.S_ISVTX
    mode = f"{stat.S_IMODE(info.st_mode):o}"
    if writable and role == LEDGER:
        raise LedgerError(
            f"ledger folder {path} is writable by others (mode {mode}), so anyone could make "
            "its folders (v1/, a device's) first and hold every user off; memgov will not use "
            f"it. Fix: `sudo chmod 0755 {path}` (as its owner or root); " + set_up_advice(ledger)
        )
    if writable and not sticky:
        raise LedgerError(
            f"folder {path} is writable by others (mode {mode}) without the sticky bit, so "
            "anyone could move or replace what is in it; memgov will not use it. Fix: "
            f"`chmod {'1777' if role == SHARED else 'go-w'} {path}` (as its owner or root)"
        )
    return info


def untrusted(path: Path, uid: int, what: str, ledger: Path) -> LedgerError:
    unmapped = ""
    if uid == overflow_uid():
        unmapped = (
            f" (uid {uid} is how this user namespace shows every host user it does not map, "
            "root included: memgov trusts it only on a folder mounted into the namespace, such "
            "as the host's ledger bind-mounted at MEMGOV_DIR, and on folders inside it)"
        )
    return LedgerError(
        f"{what} {path} belongs to uid {uid}, neither root nor you (uid {os.geteuid()}){unmapped}"
        ": its owner could move, replace or empty the ledger, so memgov will not use it. Every "
        "folder on the ledger's path must belong to root or to you; " + set_up_advice(ledger)
    )


Stack = list  # of select.epoll: see _open
"""Open folders, innermost last. Each descriptor is adopted by a ``select.epoll`` object, the one
object of the standard library that takes any descriptor and closes it, in C, when it is closed
or freed (FileIO refuses folders). So an exception raised between any two bytecodes (Ctrl-C, a
handler that raises) leaks no folder: an object dropped on the way closes its descriptor."""


def _open(stack: Stack, dir_fd: int | None, name: str) -> None:
    """Open folder ``name`` and push it onto ``stack``: open, adoption and push happen in one C
    call (extend over two maps), with no bytecode in between."""
    opened = map(functools.partial(os.open, dir_fd=dir_fd), (name,), (_DIR_FLAGS,))
    stack.extend(map(select.epoll.fromfd, opened))


def top(stack: Stack) -> int:
    """The innermost open folder's descriptor."""
    return int(stack[-1].fileno())


def _drop_parent(stack: Stack) -> None:
    """Close the folder just below the top of ``stack`` (an interrupt between the pop and the
    close leaves the popped object to be freed, which closes it: never twice)."""
    stack.pop(-2).close()


def close_all(stack: Stack) -> None:
    while stack:
        stack.pop().close()


def walk(root: Path, stack: Stack, create: bool) -> os.stat_result:
    """Push a descriptor of folder ``root`` onto ``stack``, every folder on its way checked.

    Missing folders are made (0755, this user's) when ``create``, like ``mkdir -p``; without it a
    missing one raises FileNotFoundError. Returns the root folder's stat."""
    if not root.is_absolute() or ".." in root.parts:
        raise LedgerError(f"ledger folder {root}: must be an absolute path without '..'")
    _root(stack)
    where = Path("/")
    info = check(top(stack), where, ABOVE, None, root)
    pending = list(root.parts[1:])
    hops = 0
    while pending:
        name = pending.pop(0)
        last = not pending
        if name in ("", "."):
            continue
        try:
            _open(stack, top(stack), name)
        except FileNotFoundError:
            if not create:
                raise
            hops += 1  # bounded: a folder someone keeps removing is no ledger
            if hops > MAX_SYMLINKS:
                raise LedgerError(f"ledger folder {root}: its path keeps changing") from None
            _mkdir(top(stack), name, where / name)
            pending.insert(0, name)
            continue
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR) or last:
                raise LedgerError(explain(where / name, exc)) from None
            target = _symlink(top(stack), name, where / name, info, root)
            hops += 1
            if hops > MAX_SYMLINKS:
                raise LedgerError(f"ledger folder {root}: too many symlinks on its path") from None
            pending = [*Path(target).parts, *pending]
            if target.startswith("/"):
                pending = pending[1:]
                _root(stack)
                where = Path("/")
                info = check(top(stack), where, ABOVE, None, root)
            continue
        _drop_parent(stack)
        where = where / name
        info = check(top(stack), where, LEDGER if last else ABOVE, info, root)
    return info


def _mkdir(dir_fd: int, name: str, path: Path) -> None:
    # Like mkdir -p: this user's folder (others refuse it; the admin set-up makes root's).
    try:
        os.mkdir(name, 0o755, dir_fd=dir_fd)
    except FileExistsError:
        return
    except OSError as exc:
        raise LedgerError(explain(path, exc)) from None
    with contextlib.suppress(OSError):  # the umask trimmed it
        os.chmod(name, 0o755, dir_fd=dir_fd, follow_symlinks=False)


def _root(stack: Stack) -> None:
    """Put ``/`` on top of ``stack`` (closing the folder it replaces)."""
    try:
        _open(stack, None, "/")
    except OSError as exc:
        raise LedgerError(explain(Path("/"), exc)) from None
    if len(stack) > 1:
        _drop_parent(stack)


def _symlink(dir_fd: int, name: str, path: Path, folder: os.stat_result, ledger: Path) -> str:
    """The target of a symlink on the path above MEMGOV_DIR, if it may be followed."""
    try:
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError as exc:
        raise LedgerError(explain(path, exc)) from None
    if not stat.S_ISLNK(info.st_mode):
        raise LedgerError(f"ledger folder {path}: not a folder")
    if not owner_trusted(info, path, folder):
        raise untrusted(path, info.st_uid, "symlink", ledger)
    target = os.readlink(name, dir_fd=dir_fd)
    if Path(target).parts[1:2] in (("proc",), ("sys",)):
        raise LedgerError(f"ledger folder {path} leads into {target}: not a ledger folder")
    return target


def explain(path: Path, exc: OSError) -> str:
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        return (
            f"ledger folder {path} is a symlink or not a folder; memgov never follows symlinks "
            "in the ledger (MEMGOV_DIR must be a folder)"
        )
    if exc.errno in (errno.EACCES, errno.EPERM):
        return (
            f"no permission for ledger folder {path} ({exc.strerror}): every user of a ledger "
            "must be able to reach its folders; " + set_up_advice(path)
        )
    return f"ledger folder {path}: {exc.strerror or exc}"
