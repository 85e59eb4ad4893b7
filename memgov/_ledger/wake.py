"""Sleep until a ledger folder changes, or a timeout: how waiters wait without polling blindly.

A waiter sleeps on an inotify descriptor watching its device's queue/ and claims/ folders: a
release, an admission or a ticket leaving the queue wakes it at once. The sleep is a select() with
a timeout, so it is always bounded; a holder killed by a signal changes no file, so waiters also
wake at the timeout and re-check (their scan finds the dead record). Where inotify is missing or
its per-user limit is reached, the sleep is just the timeout.

Only removals that can change a waiter's fate wake it (``sleep``'s ``wanted``): another user's
flood of files, or root's gc removing one, must not turn every waiter into a busy loop; an
event queue that overflowed wakes it (something may have been missed). A folder whose removals
matter to no one here is left out of the watch (``focus``): a waiter behind others waits for the
ticket ahead in queue/, and a flood's removals in claims/ would otherwise keep it napping
(UNWANTED_NAP_S) when that ticket goes, delaying every hand-over in the queue.

The inotify descriptor is owned like every ledger descriptor (_flock.own): closed once, closed in
forked children, never inherited across exec.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import select
import struct
import time
from collections.abc import Callable, Collection
from pathlib import Path

from memgov._files.flock import adopt

_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC
_IN_DELETE = 0x00000200
"""A record or ticket was removed (released, admitted, gave up, or cleaned)."""
_IN_MOVE_SELF = 0x00000800
"""The watched folder itself was moved: gc rebuilt it (memgov/_ledger/compact.py), and the folder at
its path is a new one, watched from then on."""
_MASK = _IN_DELETE | _IN_MOVE_SELF
_IN_Q_OVERFLOW = 0x00004000
_IN_IGNORED = 0x00008000
"""The watch is gone (its folder was removed or swapped): look, then sleep on the timeout."""
_EVENT = struct.Struct("iIII")
"""struct inotify_event: wd, mask, cookie, len; then ``len`` bytes of NUL-padded name."""
UNWANTED_NAP_S = 0.005
"""After a wake-up by removals that matter to no one here, how long a waiter lets the next ones
pile up: gc removing another user's flood deletes thousands of files a second, and a waiter
woken by each would spend a core among them. A removal that matters waits at most this long."""
_QUIET_MASK = 0x00000400 | _IN_MOVE_SELF
"""IN_DELETE_SELF: a folder out of focus wakes a waiter only if it is itself removed (or
moved)."""
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
        self._folders: dict[int, Path] = {}
        """Watch descriptor -> the folder it watches."""
        self._quiet: set[Path] = set()
        """Folders out of focus: still watched, for their own removal only (``focus``)."""
        self._moved: set[int] = set()
        """Watch descriptors of folders moved away from their path: their events are not the
        folder's any more (the new folder at the path has its own watch)."""
        libc = _load()
        if libc is None:
            return
        try:  # owned by a FileIO at once: no interrupt can leak it (_flock.adopt)
            self._file = adopt(functools.partial(libc.inotify_init1, _IN_NONBLOCK | _IN_CLOEXEC))
        except (ValueError, OSError):
            return  # e.g. the per-user instance limit: fall back to timed sleeps
        for folder in folders:
            self._watch(libc, folder, _MASK)

    def _watch(self, libc: ctypes.CDLL, folder: Path, mask: int) -> None:
        assert self._file is not None
        # Only a wake-up hint: a watch that fails (a folder swapped under us) costs latency.
        # On a folder already watched, the mask replaces the watch's own (same descriptor).
        flags = mask | _IN_ONLYDIR | _IN_DONT_FOLLOW
        wd = libc.inotify_add_watch(self._file.fileno(), os.fsencode(folder), flags)
        if wd >= 0:
            self._folders[wd] = folder

    def focus(self, folders: Collection[Path]) -> None:
        """Wake for removals in ``folders`` alone from now on: the other watched folders' no
        longer reach this waiter (nor need draining). A folder back in focus is watched from
        this call on: call it before the look whose result the next sleep waits on, so nothing
        in between is missed. The watches stay (their mask changes): removing one and closing
        the descriptor later costs the kernel a grace period, some 10 ms a close on 16 cores."""
        file, libc = self._file, _libc
        if file is None or file.closed or libc is None:
            return
        quiet = set(self._folders.values()) - set(folders)
        for folder in quiet ^ self._quiet:  # the folders whose focus changes
            self._watch(libc, folder, _QUIET_MASK if folder in quiet else _MASK)
        self._quiet = quiet

    def sleep(self, timeout: float, wanted: Callable[[Path, str], bool] | None = None) -> bool:
        """Sleep until a file that ``wanted(folder, name)`` accepts is removed (any removal
        when None): True; or ``timeout`` seconds: False."""
        file = self._file
        if file is None or file.closed:
            select.select([], [], [], max(0.0, timeout))
            return False
        deadline = time.monotonic() + timeout
        while True:
            ready, _, _ = select.select([file], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                return False
            if self._drain(wanted):
                return True
            # Only removals nobody waits for (another user's flood going, file by file): let
            # them pile up for a moment and read them in one go, rather than wake per file.
            time.sleep(max(0.0, min(UNWANTED_NAP_S, deadline - time.monotonic())))

    def _drain(self, wanted: Callable[[Path, str], bool] | None) -> bool:
        """Read every pending event; whether one of them is ``wanted`` (any, when None)."""
        assert self._file is not None
        chunks = []
        try:
            while chunk := os.read(self._file.fileno(), 65536):
                chunks.append(chunk)
        except (BlockingIOError, OSError):
            pass  # drained
        data = b"".join(chunks)
        offset = 0
        wake = False
        while offset + _EVENT.size <= len(data):
            wd, mask, _cookie, size = _EVENT.unpack_from(data, offset)
            name = data[offset + _EVENT.size : offset + _EVENT.size + size].rstrip(b"\0")
            offset += _EVENT.size + size
            if wd in self._moved:
                continue  # the old folder's, after it was moved away
            folder = self._folders.get(wd)
            if mask & _IN_MOVE_SELF and folder is not None:
                # What was in the old folder is in the new one: look again, once every moved
                # folder of this batch (several devices' at one gc) is watched anew.
                self._rewatch(wd, folder)
                wake = True
            elif mask & (_IN_Q_OVERFLOW | _IN_IGNORED) or folder is None:
                wake = True  # events were lost (or a watch we do not know): look
            elif wanted is None or wanted(folder, os.fsdecode(name)):
                wake = True
        return wake

    def _rewatch(self, wd: int, folder: Path) -> None:
        """Watch the folder now at ``folder``'s path, with the mask the moved one had."""
        self._moved.add(wd)
        del self._folders[wd]
        if _libc is not None:
            self._watch(_libc, folder, _QUIET_MASK if folder in self._quiet else _MASK)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
