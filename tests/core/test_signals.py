"""Blocks a stopping signal must not cut in two (memgov/_signals.py ``deferred``): the signal
takes effect, as it would have, once the block is done. Real signals, in a fresh interpreter."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

DRIVER = """
import os, signal, sys
from memgov import _signals
if sys.argv[2] == "raise":
    _signals.raise_on_signals()
elif sys.argv[2] == "default":
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
signum = getattr(signal, sys.argv[1])
try:
    with _signals.deferred():
        os.kill(os.getpid(), signum)
        for _ in range(100_000):  # bytecode enough for a handler to run, were it to
            pass
        print("block done", flush=True)
    print("after the block", flush=True)
except BaseException as exc:
    print(" ".join([type(exc).__name__, *map(str, getattr(exc, "args", ())[:1])]), flush=True)
    raise SystemExit(9)
"""


@pytest.mark.parametrize(
    ("signame", "handlers", "said", "code"),
    [
        ("SIGINT", "python", "KeyboardInterrupt", 9),  # Python's own Ctrl-C handler
        ("SIGTERM", "raise", "SystemExit 143", 9),  # raise_on_signals (pack, queue)
        ("SIGHUP", "raise", "SystemExit 129", 9),
        ("SIGTERM", "default", "", -signal.SIGTERM),  # the default action: the process ends
    ],
)
def test_a_signal_inside_a_deferred_block_acts_after_it(
    signame: str, handlers: str, said: str, code: int
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, signame, handlers],
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = done.stdout.splitlines()
    assert lines[0] == "block done", done.stdout + done.stderr
    assert lines[1:] == ([said] if said else []), done.stdout
    assert done.returncode == code


def test_handlers_are_put_back_and_a_quiet_block_changes_nothing() -> None:
    from memgov import _signals

    before = {s: signal.getsignal(s) for s in _signals.STOPPING}
    with _signals.deferred():
        pass
    assert {s: signal.getsignal(s) for s in _signals.STOPPING} == before
