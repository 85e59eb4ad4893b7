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


class AdmissionLock:
    def __init__(self, path: Path, timeout: float) -> None:
        self.path = path
        self.timeout = timeout
        self._fd: int | None = None

    def __enter__(self) -> AdmissionLock:
        fd = self._open()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not self._wait(fd):
                raise LedgerError(
                    f"the admission lock {self.path} was held for over {self.timeout:.0f} s; "
                    "a stopped (SIGSTOP) memgov process holds it"
                ) from None
        except OSError as exc:
            os.close(fd)
            raise LedgerError(f"cannot lock {self.path}: {exc}") from None
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing drops the flock

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

    def _wait(self, fd: int) -> bool:
        got = threading.Event()
        state = threading.Lock()
        abandoned = [False]

        def block() -> None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError:
                pass
            else:
                with state:
                    if not abandoned[0]:
                        got.set()
                        return
            os.close(fd)  # our caller gave up (or flock failed): release and forget

        waiter = threading.Thread(target=block, name="memgov-admission-lock", daemon=True)
        waiter.start()
        if got.wait(self.timeout):
            return True
        with state:
            if got.is_set():
                return True
            abandoned[0] = True
        return False


def _why(path: Path, exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return f"cannot lock {path}: it is a symlink; memgov never follows symlinks"
    return f"cannot lock {path}: {exc.strerror or exc}"
