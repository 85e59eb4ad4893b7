"""The admission lock: an exclusive flock that waiters block on, with a timeout.

filelock polls a busy lock (every 50 ms by default): with 64 processes claiming at once the
admission, held for a few ms at a time, queued claims for up to 2.8 s (p99, docs/RESULTS.md);
polling faster starved the holder of CPU. A blocking flock sleeps in the kernel and is woken when
the lock is free, so the lock passes from holder to waiter at once. The kernel also drops the lock
of a holder that dies, by any signal. Python cannot time out a blocking flock, so a waiter that
outlasts the timeout waits in a helper thread; if it gets the lock after its caller gave up, it
hands the lock straight back.

The file is opened read-only (flock needs no write access, so any user's process can lock a file
another user created) and never through a symlink.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import threading
from pathlib import Path

from memgov._errors import LedgerError

LOCK_MODE = 0o666

_open_fds: set[int] = set()
"""Lock files open in this process. A forked child closes its copies at once: an flock belongs to
the open file, so a child that kept one would hold the admission lock after its parent let go."""


def _close(fd: int) -> None:
    _open_fds.discard(fd)
    os.close(fd)


def _close_all_in_child() -> None:
    for fd in list(_open_fds):
        with contextlib.suppress(OSError):
            os.close(fd)
    _open_fds.clear()


os.register_at_fork(after_in_child=_close_all_in_child)


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


class AdmissionLock:
    def __init__(self, path: Path, timeout: float) -> None:
        self.path = path
        self.timeout = timeout
        self._fd: int | None = None

    def __enter__(self) -> AdmissionLock:
        fd = self._open()
        _open_fds.add(fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._wait(fd)  # on success the lock is held on fd; on error fd is closed or given away
        except OSError as exc:
            _close(fd)
            raise flock_error(self.path, exc) from None
        except BaseException:
            _close(fd)
            raise
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        fd, self._fd = self._fd, None
        if fd is not None and fd in _open_fds:  # not in a child forked since __enter__
            _close(fd)  # closing drops the flock

    def _open(self) -> int:
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
        for _ in range(3):
            try:
                return os.open(self.path, flags)
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise LedgerError(_why(self.path, exc)) from None
            try:
                fd = os.open(self.path, flags | os.O_CREAT | os.O_EXCL, LOCK_MODE)
            except FileExistsError:
                continue  # another process made it between our two opens
            except OSError as exc:
                raise LedgerError(_why(self.path, exc)) from None
            with contextlib.suppress(OSError):
                os.fchmod(fd, LOCK_MODE)  # the umask trimmed it; others must open it too
            return fd
        raise LedgerError(f"cannot lock {self.path}: it keeps disappearing")

    def _wait(self, fd: int) -> None:
        """Block for the lock on ``fd`` for at most the timeout, in a helper thread.

        Returns with the lock held on ``fd``; otherwise closes ``fd`` and raises. The helper
        blocks on its own duplicate of ``fd``: a flock belongs to the open file, which both
        descriptors share, so each side closes only its own descriptor and no descriptor number
        is ever closed twice or reused under the other's feet. A lock the helper gets after its
        caller gave up is released when the helper closes its duplicate, the open file's last.
        """
        helper_fd = os.dup(fd)
        _open_fds.add(helper_fd)
        done = threading.Event()
        state = threading.Lock()
        status = {"ran": False, "cancelled": False}
        failure: list[OSError] = []

        def block() -> None:
            with state:
                if status["cancelled"]:
                    return  # the caller closed helper_fd: it never reached us
                status["ran"] = True
            try:
                fcntl.flock(helper_fd, fcntl.LOCK_EX)
            except OSError as exc:
                failure.append(exc)
            finally:
                _close(helper_fd)
            done.set()

        waiter = threading.Thread(target=block, name="memgov-admission-lock", daemon=True)
        try:
            waiter.start()
            finished = done.wait(self.timeout)
        except BaseException:  # no thread, or Ctrl-C while waiting
            with state:
                if not status["ran"]:
                    status["cancelled"] = True
                    _close(helper_fd)
            _close(fd)
            raise
        if not finished:
            _close(fd)
            raise LedgerError(
                f"the admission lock {self.path} was held for over {self.timeout:.0f} s; "
                "a stopped (SIGSTOP) memgov process holds it"
            )
        if failure:
            _close(fd)
            raise flock_error(self.path, failure[0])


def _why(path: Path, exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return f"cannot lock {path}: it is a symlink; memgov never follows symlinks"
    return f"cannot lock {path}: {exc.strerror or exc}"
