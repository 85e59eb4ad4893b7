"""Descriptors the ledger owns, and the admission lock: an exclusive flock taken with a bound.

Ownership. Every descriptor that carries a lock (records, queue tickets, admission locks) lives in
an ``io.FileIO`` object and is closed only through it. ``FileIO.close()`` clears its descriptor and
closes it in one C call and is a no-op the second time, so no descriptor number is ever closed twice
or after another thread reused it, whatever exception lands where. A FileIO that is dropped without
being closed (an exception unwound past its owner) is closed by the garbage collector, which drops
its lock: an interrupted claim leaves at most a dead, unlocked file, which the next scan removes.

Forks. A flock belongs to the open file, which fork() shares with the child. A forked child closes
every ledger descriptor at once (an at-fork hook), so it never holds its parent's claim, ticket or
admission lock; forked during a ledger operation, it also replaces with /dev/null the descriptors
other threads held in the ledger without a registered FileIO (a scan's folders, a listing's copy,
a file between its open and its registration). Every open is O_CLOEXEC, so exec'd programs
inherit none. A child forked from C skips the hook; scanners catch that case through /proc/locks
(see ``lock_holders``).

Bounds. Every file another user can create is opened with O_NOFOLLOW | O_NONBLOCK (a planted FIFO
or device never blocks the open) and checked with fstat before use. Locks are only ever tried with
LOCK_NB: the admission lock is polled with a short backoff until its deadline, so no thread ever
blocks in flock without bound, and no helper thread exists (an earlier helper thread blocked on a
duplicate descriptor; see docs/ledger.md, "Bounds").
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import io
import itertools
import os
import stat
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from memgov._base import config as _config, signals as _signals
from memgov._base.errors import LedgerError, LockTimeout, MemgovError, ProfileError
from memgov._files import trust as _trust

LOCK_MODE = 0o644
"""admission.lock: everyone opens it read-only to lock it (flock needs no write access)."""

_live: dict[int, weakref.ref[io.FileIO]] = {}
"""Every ledger FileIO of this process, by id. Plain dict operations only (atomic under the GIL):
a lock here could be left held by an exception landing between its acquire and its block."""


def own(fd: int, writable: bool = False) -> io.FileIO:
    """Wrap a fresh descriptor so that it has exactly one owner (see the module docstring)."""
    try:
        file = io.FileIO(fd, "r+" if writable else "r", closefd=True)
    except IsADirectoryError:
        os.close(fd)  # FileIO refuses a folder and leaves the descriptor open
        raise
    _register(file)
    return file


def open_owned(
    path: str | Path,
    flags: int,
    dir_fd: int | None = None,
    mode: int = 0o600,
    writable: bool = False,
    register: bool = True,
) -> io.FileIO:
    """``os.open(path, flags, mode, dir_fd=dir_fd)``, owned by a FileIO before any bytecode runs.

    Interrupts (Ctrl-C, a handler that raises) land between bytecodes, never inside a C call:
    the descriptor goes into a list, and the FileIO owning it into another, each inside one C
    call (map and extend). Whatever lands where, the cleanup below closes exactly what exists:
    the FileIO if there is one, else the bare descriptor; never a number twice."""
    return adopt(functools.partial(os.open, path, flags, mode, dir_fd=dir_fd), writable, register)


def adopt(make: Callable[[], int], writable: bool = False, register: bool = True) -> io.FileIO:
    """The descriptor ``make()`` returns, owned by a FileIO before any bytecode runs (see
    open_owned); a negative number (a C call that failed) is a ValueError.

    Counted as a ledger operation until the FileIO is registered: a child forked by another
    thread in between (inside the open itself, which releases the GIL, or just after it) finds
    no registered file to close, and searches for the descriptor instead (_close_all_in_child)."""
    raw: list[int] = []
    files: list[io.FileIO] = []
    token = object()
    try:
        entering(token)
        raw.extend(itertools.islice(iter(make, None), 1))
        files.extend(map(io.FileIO, raw, ("r+" if writable else "r",)))
        if register:
            _register(files[0])
        return files[0]
    except BaseException:
        if files:
            files[0].close()
        elif raw and raw[0] >= 0:
            os.close(raw[0])  # FileIO refused it (a folder) or never ran
        raise
    finally:
        left(token)


def _register(file: io.FileIO) -> None:
    key = id(file)
    # The entry goes when the file is freed: dict.pop bound to its key, C calls only. A Python
    # callback can be entered by Ctrl-C, which Python prints as "Exception ignored" and drops
    # (the user's interrupt lost). No newer file can have taken the id by then: CPython calls
    # the callback while freeing the file, before its memory can be reused.
    _live[key] = weakref.ref(file, functools.partial(_live.pop, key))


LAYOUT_DIR = "v1"
"""The folder under a ledger's root that holds the records memgov writes (memgov/_ledger/records.py
VERSION_DIR; defined here, below it, for the fork hook)."""
OWNED_DIRS = (LAYOUT_DIR, "mps")
"""memgov's folders under a ledger's root (memgov/_files/trust.py): the fork hook's reach there."""

_roots: dict[str, tuple[str, ...]] = {}
"""Every ledger folder this process opened, as given -> the names the kernel gives it."""
_inside: list[object] = []
"""One token per ledger operation in progress in any thread (open_dir, below), added and removed
by single C calls (list append and remove): a descriptor no registered FileIO owns exists only
while one is."""
_null: list[tuple[int, int, int]] = []
"""/dev/null, opened once (O_CLOEXEC) before the first ledger operation, with its (device,
inode): a forked child needs no new descriptor to blank a stray, and checks that the number is
still /dev/null (a program that closed it may have reused it)."""


def entering(token: object) -> None:
    """A ledger operation begins in this thread. Called inside the operation's ``try``, whose
    ``finally`` calls :func:`left` with the same token: an interrupt anywhere in between leaves
    no token behind."""
    if not _null:
        with contextlib.suppress(OSError):
            fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
            info = os.fstat(fd)
            _null.append((fd, info.st_dev, info.st_ino))
    _inside.append(token)


def left(token: object) -> None:
    with contextlib.suppress(ValueError):
        _inside.remove(token)


def note_root(root: Path, fd: int | None = None) -> None:
    """Remember a ledger folder this process opens, by the names the kernel gives it (its
    realpath before it is walked; with ``fd``, the walked folder's own name too): a forked child
    finds the descriptors other threads held in it at the fork by those names."""
    key = str(root)
    known = _roots.get(key)
    if known is None:
        known = _roots[key] = (os.path.realpath(key),)
    if fd is not None and len(known) == 1:
        with contextlib.suppress(OSError):
            _roots[key] = (*known, os.readlink(f"/proc/self/fd/{fd}"))


def _close_all_in_child() -> None:
    # A forked child: only this thread exists; close its copy of every ledger descriptor.
    try:
        for ref in list(_live.values()):
            target = ref()
            if target is not None:
                with contextlib.suppress(OSError):
                    target.close()
    finally:
        if _inside:
            _inside.clear()  # the operations were other threads', which the child lacks
            _blank_strays_in_child()


def _blank_strays_in_child() -> None:
    """Descriptors in the ledger that no registered FileIO owns, left by the threads the fork
    did not copy: a folder on a scan's path (select.epoll owns those), the copy os.listdir makes
    of a folder's, a file a thread had opened and not yet registered, one read without
    registering. Such a descriptor would keep the folder or file, and any flock its parent's
    thread takes on the shared open file afterwards, for as long as the child lives. Each is
    replaced by /dev/null rather than closed: the object in the thread the fork left behind still
    names the number, and if it is ever freed it closes /dev/null, never a descriptor reused
    since. Searched: the ledger folder itself and memgov's folders in it (OWNED_DIRS; a file of
    the user's own elsewhere in it is left alone), only in a child forked while a ledger
    operation was in progress in some thread; the forking thread's own descriptors there go
    too then. Costs such a child one listing of /proc/self/fd. Best effort: without /proc, with
    no descriptor left for the listing, or cut short by an interrupt that lands in the child
    meanwhile, what it has not reached stays."""
    try:
        null, device, inode = _null[0]
        info = os.fstat(null)
    except (IndexError, OSError):
        return
    if (info.st_dev, info.st_ino) != (device, inode):
        return  # the program closed our /dev/null and the number is something else now
    folders = {name for names in _roots.values() for name in names}
    owned = {os.path.join(folder, part) for folder in folders for part in OWNED_DIRS}
    exact = folders | owned
    inside = tuple(folder + "/" for folder in owned)
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return
    for name in names:
        try:
            target = os.readlink(f"/proc/self/fd/{name}").removesuffix(" (deleted)")
            if (target in exact or target.startswith(inside)) and int(name) != null:
                os.dup2(null, int(name), inheritable=False)
        except (OSError, ValueError):
            continue  # the listing's own descriptor (closed by now), or one that would not go


os.register_at_fork(after_in_child=_close_all_in_child)


_lifetime: list[weakref.ref[Any]] = []
"""Holders of a file held for the whole process on purpose (its CPU-share record: _cpushare)."""


def held_for_life(holder: Any) -> None:
    """Mark the file ``holder.file`` holds, whichever it is at the time (an update swaps in a
    new one), as held until the process exits by design: open_count leaves it out. By holder,
    not by file: an interrupt between a swap and a new marking would leave the new file
    counted as a stray."""
    _lifetime[:] = [ref for ref in _lifetime if ref() is not None]
    _lifetime.append(weakref.ref(holder))


def open_count() -> int:
    """Ledger descriptors open in this process (tests: nothing may stay open after a claim),
    besides those held for the process's life on purpose."""
    kept = {id(holder.file) for ref in list(_lifetime) if (holder := ref()) is not None}
    files = [(key, ref()) for key, ref in list(_live.items())]
    return sum(1 for key, f in files if f is not None and not f.closed and key not in kept)


NO_FLOCK = frozenset({errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL})
"""flock's errors on a filesystem that has no flock (some NFS mounts, FUSE filesystems)."""


def flock_error(path: Path, exc: OSError) -> LedgerError:
    """The LedgerError for a flock that failed with ``exc`` (not one that is merely busy)."""
    if exc.errno in NO_FLOCK:
        return LedgerError(
            f"cannot lock {path}: the ledger folder's filesystem does not support flock "
            f"({exc.strerror or exc}); use a local filesystem for MEMGOV_DIR "
            "(e.g. /tmp/memgov-ledger)"
        )
    return LedgerError(f"cannot lock {path}: {exc.strerror or exc}")


def try_lock(file: io.FileIO, op: int, path: Path) -> bool:
    """flock(op | LOCK_NB): True if taken, False if busy; LedgerError if locking is impossible."""
    try:
        fcntl.flock(file.fileno(), op | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as exc:
        raise flock_error(path, exc) from None
    return True


def lock_table() -> dict[str, list[int]] | None:
    """Flocks on the host from /proc/locks: "MAJ:MIN:INODE" -> PIDs that took them (as this PID
    namespace sees them; 0 = not visible). None where /proc/locks cannot be read."""
    try:
        with open("/proc/locks", "rb") as f:
            text = f.read(16 * 2**20).decode("ascii", "replace")
    except OSError:
        return None
    table: dict[str, list[int]] = {}
    for line in text.splitlines():
        fields = line.split()
        # "1: FLOCK  ADVISORY  WRITE 1234 00:2e:5678 0 EOF"; blocked waiters start with "->"
        if len(fields) >= 6 and fields[1] == "FLOCK":
            pid = int(fields[4]) if fields[4].lstrip("-").isdigit() else 0
            table.setdefault(fields[5], []).append(pid)
    return table


def lock_holders(dev: int, ino: int) -> list[int] | None:
    """PIDs with a flock on the inode (see ``lock_table``); None where unknown."""
    table = lock_table()
    if table is None:
        return None
    return table.get(f"{os.major(dev):02x}:{os.minor(dev):02x}:{ino}", [])


def pid_running(pid: int) -> bool:
    """Whether ``pid`` (in this PID namespace) is a live process; unknown counts as live."""
    if pid <= 0:
        return True  # not visible from here: assume alive (fail closed)
    return process_alive(pid)


def process_alive(pid: int, start: int | None = None) -> bool:
    """Whether ``pid`` (in this PID namespace) is a live process, and, given ``start`` (the tick
    since boot its record's writer started at, _records.writer), that process: another given
    the same PID later starts at another tick. Ticks since boot, not the wall clock, which a
    step (NTP, a resumed VM) moves under a live process. Unknown counts as alive. A zombie
    thread-group leader whose other threads still run is alive: its main thread ended, the
    process (and the descriptors holding its locks) did not."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read(4096).rsplit(b")", 1)[-1].split()
    except FileNotFoundError:
        return False
    except OSError:
        return True
    if start is not None and len(fields) > 19 and fields[19] != b"%d" % start:
        return False  # the PID was reused after the record's writer died
    if fields and fields[0] in (b"Z", b"X"):
        return _other_threads_run(pid)
    return True


def _other_threads_run(pid: int) -> bool:
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for tid in tasks:
        if tid == str(pid):
            continue
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
                state = f.read(4096).rsplit(b")", 1)[-1].split()[:1]
        except OSError:
            continue
        if state and state[0] not in (b"Z", b"X"):
            return True
    return False


class AdmissionLock:
    """The device's admission lock: taken with LOCK_EX | LOCK_NB, retried until ``timeout``."""

    def __init__(
        self,
        path: Path,
        timeout: float,
        may_create: bool = True,
        folder: os.stat_result | None = None,
        per_holder: bool = False,
        waiting: Callable[[], None] | None = None,
    ) -> None:
        self.path = path
        self.folder = folder
        """The checked folder it lies in (_trust: who may own the lock file)."""
        self.timeout = timeout
        self.may_create = may_create
        self.per_holder = per_holder
        """The bound is one holder's: past it, a running holder that is not the one the last
        bound found lets the tries go on (claims in turn on a busy host make progress)."""
        self.waiting = waiting
        """Called about once a second while the lock is busy (a waiter's sign that it runs)."""
        self._file: io.FileIO | None = None

    def __enter__(self) -> AdmissionLock:
        beaten = time.monotonic()
        deadline = beaten + self.timeout
        delay = 0.0002
        before: dict[int, bytes] | None = None
        """Who held the lock at the last bound, and how far each had run (per_holder)."""
        rounds = 0
        while True:
            file = self._open()
            try:
                if try_lock(file, fcntl.LOCK_EX, self.path):
                    if self._still_linked(file):
                        self._file = file
                        return self
                    file.close()  # locked a file that was unlinked: retry on the new one
                    continue
                file.close()
                now = time.monotonic()
                remaining = deadline - now
                if remaining <= 0 and not self.timeout:
                    raise LockTimeout(f"{self.path} is held")  # one try: who holds it matters not
                if remaining <= 0:
                    seen = {p: _ran(p) for p in _holders(self.path)}
                    stopped = [p for p, ran in seen.items() if ran[:1] in (b"T", b"t")]
                    same = before is not None and seen.keys() == before.keys()
                    rounds = rounds + 1 if same else 0
                    # One holder through a whole bound without running nor waiting (for a CPU or
                    # the disk; or through ten) is stuck; one that ran, or a new one: the load.
                    waits_for_cpu = any(ran[:1] in (b"R", b"D") for ran in seen.values())
                    stuck = same and ((seen == before and not waits_for_cpu) or rounds >= 10)
                    if stopped or not self.per_holder or stuck:
                        raise LockTimeout(self._held_too_long(stopped, stuck))
                    before, deadline, remaining = seen, now + self.timeout, self.timeout
                if self.waiting is not None and now - beaten >= 1.0:
                    self.waiting()
                    beaten = now
                with _signals.interruptible():  # Ctrl-C ends a wait (claim() defers it elsewhere)
                    time.sleep(min(delay, remaining))
                delay = min(delay * 2, 0.005)
            except BaseException:
                file.close()
                raise

    def __exit__(self, *exc: object) -> None:
        file, self._file = self._file, None
        if file is not None:
            file.close()  # drops the flock (a no-op in a forked child: the hook closed it)

    def _still_linked(self, file: io.FileIO) -> bool:
        try:
            now = os.stat(self.path, follow_symlinks=False)
        except FileNotFoundError:
            return False
        mine = os.fstat(file.fileno())
        return (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino)

    def _open(self) -> io.FileIO:
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        for _ in range(3):
            try:
                file = open_owned(self.path, flags)
            except IsADirectoryError:
                raise LedgerError(
                    f"cannot lock {self.path}: a folder was put there; remove it (root may have to)"
                ) from None
            except FileNotFoundError:
                if not self.may_create:
                    raise LedgerError(
                        f"{self.path} is missing, and its folder belongs to root: only root "
                        "creates it (run `sudo memgov gc` once; docs/ledger.md, 'Set-ups')"
                    ) from None
            except OSError as exc:
                raise LedgerError(_why(self.path, exc)) from None
            else:
                _check_lock_file(file, self.path, self.folder)
                return file
            try:
                file = open_owned(self.path, flags | os.O_CREAT | os.O_EXCL, mode=LOCK_MODE)
            except FileExistsError:
                continue  # another process made it between our two opens
            except OSError as exc:
                raise LedgerError(_why(self.path, exc)) from None
            with contextlib.suppress(OSError):  # the umask trimmed it; others must open it
                os.fchmod(file.fileno(), LOCK_MODE)
            return file
        raise LedgerError(f"cannot lock {self.path}: it keeps disappearing")

    def _held_too_long(self, stopped: list[int], same: bool) -> str:
        said = f"the admission lock {self.path} was held for over {self.timeout:g} s"
        said += lock_holder_text(self.path)
        if stopped:
            return (
                f"{said}; pid {', '.join(map(str, stopped))} is stopped (SIGSTOP), and every "
                "claim on this device waits for it until it is resumed or killed"
            )
        if same:
            return (
                f"{said}, and by the same process {self.timeout:g} s before, which has not run "
                "since (or held it ten times as long): a hung or hostile process holds it, "
                "and every claim on this device waits for it"
            )
        return f"{said}, running: claims taking it in turn on a busy host, or one slow holder"


def _holders(path: Path) -> set[int]:
    """The PIDs this namespace sees holding the flock on ``path`` (empty: none or unknown)."""
    try:
        info = os.stat(path, follow_symlinks=False)
    except OSError:
        return set()
    return {p for p in lock_holders(info.st_dev, info.st_ino) or [] if p > 0}


def _ran(pid: int) -> bytes:
    """``pid``'s state and CPU time so far (/proc/PID/stat: state, utime, stime), b"" where
    unknown: T or t, stopped (SIGSTOP or a tracer), will not let go of a lock."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read(4096).rsplit(b")", 1)[-1].split()
    except OSError:
        return b""
    return b" ".join(fields[:1] + fields[11:13])


def lock_holder_text(path: Path) -> str:
    """Who holds the flock on ``path``, as far as this process can tell (an error message's
    words; read only when a lock was held too long, never per scan)."""
    try:
        info = os.stat(path, follow_symlinks=False)
    except OSError:
        return ""
    pids = lock_holders(info.st_dev, info.st_ino)
    if pids is None:
        return f" (who holds it is unknown: /proc/locks cannot be read here; try `lsof {path}`)"
    visible = [p for p in pids if p > 0]
    if not visible:
        # /proc/locks lists a lock of a process this PID namespace cannot see as pid 0, or (newer
        # kernels) not at all: either way the holder is outside this namespace.
        return (
            " by a process outside this PID namespace (this namespace's /proc/locks does not "
            f"name it); on the host, `lsof {path}` or `grep :{info.st_ino} /proc/locks` names it"
        )
    alive = [p for p in visible if pid_running(p)]
    if alive:
        return " by pid " + ", ".join(map(str, alive))
    took = ", ".join(map(str, visible))
    heirs = [p for p in _open_by(info) if p != os.getpid()]
    if heirs:
        return (
            f" by pid {', '.join(map(str, heirs))}, which inherited it from pid {took} (gone): "
            "a child forked from C keeps its parent's descriptors"
        )
    return (
        f" by a child of pid {took} (gone), which inherited the descriptor; this user cannot "
        f"see which: `sudo lsof {path}` names it"
    )


def _open_by(info: os.stat_result) -> list[int]:
    """PIDs (this namespace) with a descriptor open on the file ``info`` describes."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                seen = os.stat(f"/proc/{entry}/fd/{fd}")
            except OSError:
                continue
            if (seen.st_dev, seen.st_ino) == (info.st_dev, info.st_ino):
                found.append(int(entry))
                break
    return found


def _check_lock_file(file: io.FileIO, path: Path, folder: os.stat_result | None) -> None:
    try:
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise LedgerError(
                f"cannot lock {path}: not a regular file (a FIFO, device or folder was put "
                "there); remove it (root may have to)"
            )
        if not _trust.owner_trusted(info, path, folder):
            raise _trust.untrusted(path, info.st_uid, "lock file", path.parent.parent.parent)
    except BaseException:
        file.close()
        raise


def _why(path: Path, exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return f"cannot lock {path}: it is a symlink; memgov never follows symlinks"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return (
            f"cannot lock {path}: {exc.strerror}; it must be readable by every user of the "
            "ledger (mode 0644, owned by root or by you); remove it (root may have to)"
        )
    return f"cannot lock {path}: {exc.strerror or exc}"


# -- folders and whole files: the records', the dead names', the profile store's and MPS's --

TMP_PREFIX = ".tmp-"
SHARED_DIR_MODE = 0o1777
"""Folders root makes are shared by every user; the sticky bit keeps others' files safe."""
PRIVATE_DIR_MODE = 0o755
SHARED_FOLDERS = ("claims", "queue", "cpu", "stats", "_profiles", "_queue")
"""Folders every user writes in (root makes them 1777, sticky): claim records, queue tickets,
CPU-share records, counters, and each user's private profile and job-queue folders
(memgov/_profiles/store.py, memgov/queue/store.py)."""
RECORD_MODE = 0o644


PARTS = ("v1", "_profiles")
"""``_profiles``: a name no device folder takes (simulated names start with a letter or digit,
real ones with "GPU-"). Root's ``memgov gc`` makes it 1777 in a shared ledger."""
PRIVATE_MODE = 0o700


@contextlib.contextmanager
def open_dir(root: Path, parts: tuple[str, ...], create: bool) -> Iterator[int]:
    """Yield a descriptor of root/parts..., every folder on the way checked
    (memgov/_files/trust.py).

    The whole path from ``/`` is walked (symlinks above ``root`` only where root or this user
    owns them); from ``root`` down nothing is followed. Only a folder's owner creates folders in
    it: in a root-owned ledger the device folders are made by root (docs/ledger.md, "Set-ups").
    A missing folder raises FileNotFoundError unless ``create``.
    """
    # The open folders, each owned by an object that closes it when freed (_trust.Stack): an
    # exception anywhere leaks no folder descriptor and never closes a number twice.
    stack: _trust.Stack = []
    token = object()
    try:
        note_root(root)
        entering(token)  # a fork meanwhile: the child looks for what this leaves it (_flock)
        info = _trust.walk(root, stack, create)
        note_root(root, _trust.top(stack))
        path = root
        for part in parts:
            parent, path = path, path / part
            try:
                _trust._open(stack, _trust.top(stack), part)
            except FileNotFoundError:
                if not create:
                    raise
                _mkdir(_trust.top(stack), part, path, parent)
                try:
                    _trust._open(stack, _trust.top(stack), part)
                except OSError as exc:
                    raise LedgerError(_trust.explain(path, exc)) from None
            except OSError as exc:
                raise LedgerError(_trust.explain(path, exc)) from None
            _trust._drop_parent(stack)
            role = _trust.SHARED if part in SHARED_FOLDERS else _trust.LEDGER
            info = _trust.check(_trust.top(stack), path, role, info, root)
        yield _trust.top(stack)
    finally:
        try:
            _trust.close_all(stack)
        finally:
            left(token)


def _mkdir(dir_fd: int, name: str, path: Path, parent: Path) -> None:
    if os.geteuid() != 0 and os.fstat(dir_fd).st_uid != os.geteuid():
        # A folder this user made in root's ledger would be this user's: others would refuse it.
        raise LedgerError(
            f"ledger folder {path} is missing, and {parent} belongs to root: only root creates "
            "folders there. Run `sudo memgov gc` once (it creates every device's folders; "
            "docs/ledger.md, 'Set-ups')"
        )
    # Only claims/, queue/ and cpu/ are written by every user: root makes those 1777 (sticky,
    # like /tmp) and every other folder 0755, so no user can plant files (admission.lock, a
    # device folder) beside them. Any other user's folders are private (0755).
    shared = os.geteuid() == 0 and name in SHARED_FOLDERS
    mode = SHARED_DIR_MODE if shared else PRIVATE_DIR_MODE
    try:
        os.mkdir(name, mode, dir_fd=dir_fd)
    except FileExistsError:
        return  # another process made it first
    except OSError as exc:
        raise LedgerError(_trust.explain(path, exc)) from None
    with contextlib.suppress(OSError):  # the umask trimmed the mode
        os.chmod(name, mode, dir_fd=dir_fd, follow_symlinks=False)


@contextlib.contextmanager
def private_folder(create: bool = True, root: Path | None = None) -> Iterator[tuple[int, Path]]:
    """This user's private store (profiles, dead names) in ledger ``root`` (default MEMGOV_DIR's):
    (descriptor, path), checked to be this user's and private."""
    root = root or _config.ledger_dir()
    uid = str(os.geteuid())
    path = root.joinpath(*PARTS, uid)
    # Each folder descriptor owned by an object that closes it when freed (_trust.Stack): an
    # interrupt anywhere (Ctrl-C in a notebook) leaks none.
    stack: _trust.Stack = []
    try:
        # The private folder is used inside the ledger operation: a fork meanwhile finds it
        # (memgov/_files/flock.py, forked children).
        with open_dir(root, PARTS, create=create) as parent:
            open_private(stack, parent, path, create, ProfileError, "profile")
            yield _trust.top(stack), path
    finally:
        _trust.close_all(stack)


def open_private(
    stack: _trust.Stack, parent: int, path: Path, create: bool, error: type[MemgovError], kind: str
) -> None:
    """Push this user's folder ``path`` of ``parent`` onto ``stack`` (made 0700 if ``create``),
    never through a link, never another user's: else ``error``, naming the ``kind`` of folder."""
    try:
        _trust._open(stack, parent, path.name)
    except FileNotFoundError:
        if not create:
            raise
        with contextlib.suppress(FileExistsError):
            os.mkdir(path.name, PRIVATE_MODE, dir_fd=parent)
        return open_private(stack, parent, path, False, error, kind)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise error(
                f"{kind} folder {path} is a symlink or not a folder; memgov never follows "
                "symlinks: it does not use it"
            ) from None
        raise error(f"{kind} folder {path}: {exc.strerror or exc}") from None
    info = os.fstat(_trust.top(stack))
    if info.st_uid != os.geteuid():
        raise error(
            f"{kind} folder {path} belongs to uid {info.st_uid}, not you (uid {os.geteuid()}): "
            "another user made it, so memgov does not use it; root's `memgov gc` removes it "
            f"(or `sudo rm -r {path}`)"
        )
    if stat.S_IMODE(info.st_mode) != PRIVATE_MODE:
        os.fchmod(_trust.top(stack), PRIVATE_MODE)  # the umask or an old memgov: make it private


def is_dir(folder_fd: int, name: str) -> bool:
    """Whether ``name`` of the folder is a folder itself (not through a link)."""
    try:
        return stat.S_ISDIR(os.stat(name, dir_fd=folder_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def write_atomic(
    folder_fd: int, name: str, data: bytes, mode: int = RECORD_MODE, durable: bool = True
) -> os.stat_result:
    """Replace file ``name`` of a folder with ``data``, whole or not at all, never via a symlink.

    A temporary file in the same folder, fsync, ``os.replace``, then fsync of the folder: a reader
    sees the old content or the new, never a torn file. For files without a holder (pack's
    history); callers serialise writers themselves. Held records use create/replace.
    ``durable=False`` skips both fsyncs (a file that may go back to an older content after a
    crash of the host): an fsync commits every pending change of the filesystem, another
    user's flood of files included, so none is taken under the admission lock. Returns the new
    file's stat (to know it again without a stat by name).
    """
    tmp = f"{TMP_PREFIX}{name}-{os.urandom(4).hex()}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    file = open_owned(tmp, flags, folder_fd, mode=mode, writable=True)  # no interrupt leaks it
    try:
        fd = file.fileno()
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if durable:
            os.fsync(fd)
        info = os.fstat(fd)
        os.replace(tmp, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=folder_fd)
        raise
    finally:
        file.close()
    if durable:
        with contextlib.suppress(OSError):
            os.fsync(folder_fd)
    return info
