"""SIGTERM and SIGHUP as exceptions, so the ``finally`` blocks of a long-running command run;
and blocks that such an exception must not cut in two."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def raise_on_signals() -> Callable[[], None]:
    """Make SIGTERM/SIGHUP raise SystemExit(128 + signal), like Ctrl-C's KeyboardInterrupt.

    Returns the function that puts the previous handlers back. Python only lets the main thread
    set handlers; elsewhere nothing changes and the returned function does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def leave(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = {s: signal.signal(s, leave) for s in (signal.SIGTERM, signal.SIGHUP)}

    def restore() -> None:
        for s, handler in previous.items():
            signal.signal(s, handler)

    return restore


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Run the block whole: Ctrl-C, SIGTERM or SIGHUP arriving inside it takes effect (its
    handler runs, raising where it raises) once the block is done.

    For a child process started and recorded in one step: an interrupt inside
    ``subprocess.Popen(...)`` after the fork (it waits for the exec) would leave the child
    running with no one holding its ``Popen``, so nothing would ever stop it. In threads other
    than the main one (where Python runs no handler) the block just runs.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[tuple[int, FrameType | None]] = []

    def later(signum: int, frame: FrameType | None) -> None:
        arrived.append((signum, frame))

    previous: dict[int, Any] = {s: signal.signal(s, later) for s in STOPPING}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if arrived:
            signum, frame = arrived[0]
            handler = previous[signum]
            if callable(handler):
                handler(signum, frame)
            elif handler == signal.SIG_DFL:
                os.kill(os.getpid(), signum)  # what it would have done: its default action
