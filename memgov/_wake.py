"""Sleep until a ledger folder changes, or a timeout: how waiters wait without polling blindly.

A waiter sleeps on an inotify descriptor watching its device's queue/ and claims/ folders: a
release, an admission or a ticket leaving the queue wakes it at once. The sleep is a select() with
a timeout, so it is always bounded; a holder killed by a signal changes no file, so waiters also
wake at the timeout and re-check (their scan finds the dead record). Where inotify is missing or
its per-user limit is reached, the sleep is just the timeout.

The inotify descriptor is owned like every ledger descriptor (_flock.own): closed once, closed in
forked children, never inherited across exec.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import select
from pathlib import Path

from memgov._flock import adopt

_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC
_MASK = 0x00000200
"""IN_DELETE: a record or ticket was removed (released, admitted, gave up, or cleaned)."""
_IN_ONLYDIR = 0x01000000
_IN_DONT_FOLLOW = 0x02000000

_libc: ctypes.CDLL | None = None


def _load() -> ctypes.CDLL | None:
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            _libc.inotify_init1  # noqa: B018 (raises AttributeError where there is none)
        except (OSError, AttributeError):
            return None
    return _libc


class Waker:
    """Wakes when any of ``folders`` changes; ``sleep`` returns at the latest after its timeout."""

    def __init__(self, folders: list[Path]) -> None:
        self._file = None
        libc = _load()
        if libc is None:
            return
        try:  # owned by a FileIO at once: no interrupt can leak it (_flock.adopt)
            self._file = adopt(functools.partial(libc.inotify_init1, _IN_NONBLOCK | _IN_CLOEXEC))
        except (ValueError, OSError):
            return  # e.g. the per-user instance limit: fall back to timed sleeps
        fd = self._file.fileno()
        for folder in folders:
            # Only a wake-up hint: a watch that fails (a folder swapped under us) costs latency.
            libc.inotify_add_watch(fd, os.fsencode(folder), _MASK | _IN_ONLYDIR | _IN_DONT_FOLLOW)

    def sleep(self, timeout: float) -> None:
        file = self._file
        if file is None or file.closed:
            select.select([], [], [], max(0.0, timeout))
            return
        ready, _, _ = select.select([file], [], [], max(0.0, timeout))
        if ready:
            try:
                while os.read(file.fileno(), 65536):
                    pass
            except (BlockingIOError, OSError):
                pass  # drained

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
