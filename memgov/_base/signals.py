"""SIGTERM and SIGHUP as exceptions, so the ``finally`` blocks of a long-running command run;
and blocks that a signal handler's exception must not cut in two."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
SIG_DFL = signal.SIG_DFL


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


_taken: dict[int, Any] = {}
"""The handlers deferred blocks replaced (main thread), by signal; an entry goes only once its
handler is back (so one that an interrupt left behind is still known to the next block)."""
_arrived: list[int] = []
"""The signals that arrived meanwhile, in order, each once."""
_active: list[object] = []
"""One token per deferred block running (blocks nest: only the outermost takes over)."""
RESTORE_TRIES = 100
"""How often putting the handlers back is begun again when a handler already back interrupts
it (its signal arrived meanwhile): as memgov/_ledger/records.py's clean-up of an interrupted
write."""


def _later(signum: int, _frame: FrameType | None) -> None:
    if signum not in _arrived:
        _arrived.append(signum)


def _take_over(acting: list[int] | None = None) -> None:
    """Record every signal a handler of Python's would act on (and the stopping ones) instead,
    or those ``acting``. While they are taken, no handler but ``_later`` runs for them."""
    if acting is None:
        handlers = {s: signal.getsignal(s) for s in signal.valid_signals()}
        # Not one a C library installed (None: Python cannot put it back), nor one ignored.
        acting = [s for s, h in handlers.items() if callable(h) or (s in STOPPING and h == SIG_DFL)]
    for s in acting:
        with contextlib.suppress(OSError, ValueError):  # one Python may not handle
            previous = signal.signal(s, _later)
            _taken.setdefault(s, previous)  # a handler left out by an interrupt stays known


def _give_back() -> None:
    """Put the handlers back, then send each signal that arrived meanwhile again: it takes
    effect as it would have, its handler running (raising where it raises) at the next bytecode,
    or its default action (a SIGTERM left at its default ends the process). A handler back
    already may interrupt the others' return (its signal arrived just then): they go back all
    the same, and that exception is raised once they have."""
    raised: BaseException | None = None
    for _ in range(RESTORE_TRIES):
        try:
            while _taken:
                s = next(iter(_taken))
                signal.signal(s, _taken[s])
                del _taken[s]
            break
        except BaseException as exc:
            raised = exc
    if raised is not None:
        raise raised
    while _arrived:
        signal.raise_signal(_arrived.pop(0))


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Run the block whole: a signal that arrives inside it takes effect (its handler runs,
    raising where it raises) once the block is done. Every signal with a Python handler is
    deferred (Ctrl-C's KeyboardInterrupt, a SIGALRM handler that raises), and SIGTERM and
    SIGHUP also where they have none (their default action waits too). Blocks nest: an inner
    one changes nothing. A block may open a window where they act at once (``interruptible``).

    For memgov's own work between an open and its close: claim() and release() run deferred,
    so an exception a handler raises never lands between two statements of their clean-up (a
    traceback kept alive, as an interactive session keeps the last, would hold what an
    interrupted frame opened: a record, a lock). For a child process started and recorded in one
    step: an interrupt inside ``subprocess.Popen(...)`` after the fork (it waits for the exec)
    would leave the child running with no one holding its ``Popen``, so nothing would ever stop
    it. In threads other than the main one (where Python runs no handler) the block just runs.
    """
    if _active or threading.current_thread() is not threading.main_thread():
        yield
        return
    token = object()
    try:
        _active.append(token)
        _take_over()
        yield
    finally:
        try:
            _give_back()
        finally:
            _active.remove(token)


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """Inside a deferred block, a window where signals act at once, those that arrived before it
    first: a wait (a queued claim's sleep, a lock's backoff) that Ctrl-C must cut short, at a
    point where the code around it cleans up after any exception. Elsewhere it changes nothing."""
    if not _active or threading.current_thread() is not threading.main_thread():
        yield
        return
    taken = list(_taken)  # taken again as they were (a lock's backoff opens one per try)
    try:
        _give_back()
        yield
    finally:
        _take_over(taken)
