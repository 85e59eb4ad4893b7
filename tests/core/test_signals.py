"""Blocks a stopping signal must not cut in two (memgov/_base/signals.py ``deferred``): the signal
takes effect, as it would have, once the block is done. Real signals, in a fresh interpreter."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

DRIVER = """
import os, signal, sys
from memgov._base import signals as _signals
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
    from memgov._base import signals as _signals

    before = {s: signal.getsignal(s) for s in _signals.STOPPING}
    with _signals.deferred():
        pass
    assert {s: signal.getsignal(s) for s in _signals.STOPPING} == before


WINDOW = """
import os, signal
from memgov._base import signals as _signals

class Alarm(Exception):
    pass

def alarm(signum, frame):
    raise Alarm

def spin():
    for _ in range(100_000):  # bytecode enough for a handler to run, were it to
        pass

signal.signal(signal.SIGALRM, alarm)
try:
    with _signals.deferred():
        os.kill(os.getpid(), signal.SIGALRM)
        spin()
        print("deferred", flush=True)
        try:
            with _signals.interruptible():
                spin()
        except Alarm:
            print("acted in the window", flush=True)
        os.kill(os.getpid(), signal.SIGALRM)
        spin()
        print("deferred again", flush=True)
except Alarm:
    print("acted after the block", flush=True)
"""


def test_any_python_handler_waits_for_the_block_but_acts_in_its_window() -> None:
    done = subprocess.run(
        [sys.executable, "-c", WINDOW], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "deferred",
        "acted in the window",
        "deferred again",
        "acted after the block",
    ]


SIGNAL_AS_CLAIM_ENDS = """
import os, signal
import memgov
from memgov import _runs
from memgov._gpu.devices import candidates
from memgov._ledger.ledger import DeviceLedger

class Alarm(Exception):
    pass

def alarm(signum, frame):
    raise Alarm

signal.signal(signal.SIGALRM, alarm)
start = _runs.start

def start_after_a_signal(*args):  # the signal arrives in the claim's last step
    os.kill(os.getpid(), signal.SIGALRM)
    for _ in range(100_000):
        pass
    start(*args)

_runs.start = start_after_a_signal
try:
    memgov.claim("1GiB")
    print("returned")
except Alarm:
    claims = DeviceLedger(candidates(None)[0]).snapshot().claims
    print("raised", memgov.current() is None, len(claims))
"""


def test_a_signal_during_a_claim_acts_after_it_and_the_claim_holds_nothing(sim: str) -> None:
    """The handler runs once the claim is made, not inside it; what it raises undoes the claim,
    as any failed claim() is undone (before, it raised inside and the claim stayed held)."""
    done = subprocess.run(
        [sys.executable, "-c", SIGNAL_AS_CLAIM_ENDS], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["raised", "True", "0"]
