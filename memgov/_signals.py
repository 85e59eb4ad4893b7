"""SIGTERM and SIGHUP as exceptions, so the ``finally`` blocks of a long-running command run."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable


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
