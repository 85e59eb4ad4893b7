"""Claim and release in a loop while a timer raises KeyboardInterrupt at random moments (as
Ctrl-C does in a notebook): python interrupted_claims.py CYCLES SEED MAX_DELAY_S [keep].

Prints one JSON line: cycles, how many were interrupted, and the descriptors open before and
after (from /proc/self/fd, once memgov's threads have ended), the ledger files memgov still has
open and the threads left. With ``keep``, each interrupt is kept as an interactive session keeps
the last one (sys.last_value and its traceback, whose frames stay alive with it) until the
next cycle, and ``kept`` lists what the process still had open in the ledger (its own CPU-share
record aside) once the interrupted claim was released: run with MEMGOV_THREADS=once (no
follower thread whose own work would show there).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import random
import signal
import sys
import time

import memgov
from memgov._cpu import threads as _threads
from memgov._files import flock as _flock


def interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def descriptors() -> int:
    """Open descriptors, but for this process's CPU-share record: held for the process's life
    by design, and replaced by a new file whenever the share's follower updates it (which it
    may do between the two counts). Any other CPU-share record left open counts."""
    registration = _threads._state.get("registration")
    held = getattr(getattr(registration, "held", None), "file", None)
    mine = str(held.fileno()) if held is not None and not held.closed else None
    return sum(1 for fd in targets() if fd != mine)


def targets() -> dict[str, str]:
    """Each open descriptor and what it is (a leak's report names it)."""
    found = {}
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor, closed by now
            found[fd] = os.readlink(f"/proc/self/fd/{fd}")
    return found


def share_record_held() -> bool | None:
    """Whether this process's CPU-share record, as the folder shows it, is the file the process
    holds (None: it has none): an update cut short after its rename once left the process
    holding the old, unlinked file, the visible one unlocked and counted out by every reader."""
    registration = _threads._state.get("registration")
    held = getattr(registration, "held", None)
    if held is None:
        return None
    try:
        there = os.stat(held.path, follow_symlinks=False)
        mine = os.fstat(held.file.fileno())
    except (OSError, ValueError):
        return False
    return (there.st_dev, there.st_ino) == (mine.st_dev, mine.st_ino)


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


def in_ledger() -> list[str]:
    """This process's descriptors into the ledger, but for its own CPU-share record."""
    registration = _threads._state.get("registration")
    held = getattr(getattr(registration, "held", None), "file", None)
    mine = str(held.fileno()) if held is not None and not held.closed else None
    root = os.path.realpath(os.environ["MEMGOV_DIR"]) + "/"
    return [what for fd, what in targets().items() if what.startswith(root) and fd != mine]


def main() -> None:
    cycles, seed, most = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    keep = sys.argv[4:] == ["keep"]
    kept: list[str] = []
    rng = random.Random(seed)
    signal.signal(signal.SIGALRM, interrupt)
    memgov.claim("1GiB").release()  # imports, folders and the CPU-share record made once
    before = descriptors()
    opened = targets()
    interrupted = 0
    for _ in range(cycles):
        try:
            try:
                signal.setitimer(signal.ITIMER_REAL, rng.uniform(0.00005, most))
                memgov.claim("1GiB").release()
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)  # one-shot: it cannot fire again after
        except KeyboardInterrupt as exc:
            interrupted += 1
            if keep:
                sys.last_value, sys.last_traceback = exc, exc.__traceback__
        held = memgov.current()
        if held is not None:  # interrupted after the claim was made: released like a user would
            held.release()
        if keep and sys.last_value is not None:
            kept.extend(in_ledger())  # what the kept frames hold (a record, a lock, a file)
            sys.last_value = sys.last_traceback = None
    # The thread share's follower may be swapping this process's CPU-share record (a new locked
    # file renamed over it, then the old one closed) at any moment: stopped first, so that the
    # count below sees no such swap half-way.
    follower = _threads._state.get("follower")
    _threads.stop_following()
    if isinstance(follower, tuple):
        follower[0].join(timeout=10)
    gc.collect()
    # A run's sampler (a bare thread, memgov/_runs.py) told to stop by an interrupted release
    # may still be taking its last sample, a /proc file open: its end is awaited, not counted
    # as a leak. What is left after 10 s is reported (``threads``).
    deadline = time.monotonic() + 10
    while threads() > 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    print(
        json.dumps(
            {
                "cycles": cycles,
                "interrupted": interrupted,
                "before": before,
                "after": descriptors(),
                "ledger_files": _flock.open_count(),
                "threads": threads(),
                "share_record_held": share_record_held(),
                "new": {fd: what for fd, what in targets().items() if opened.get(fd) != what},
                "kept": kept,
            }
        )
    )


if __name__ == "__main__":
    main()
