"""Claim and release in a loop while a timer raises KeyboardInterrupt at random moments (as
Ctrl-C does in a notebook): python interrupted_claims.py CYCLES SEED MAX_DELAY_S.

Prints one JSON line: cycles, how many were interrupted, and the descriptors open before and
after (from /proc/self/fd, once memgov's threads have ended), the ledger files memgov still has
open and the threads left.
"""

from __future__ import annotations

import gc
import json
import os
import random
import signal
import sys
import time

import memgov
from memgov import _flock, _threads


def interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


def main() -> None:
    cycles, seed, most = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    rng = random.Random(seed)
    signal.signal(signal.SIGALRM, interrupt)
    memgov.claim("1GiB").release()  # imports, folders and the CPU-share record made once
    before = descriptors()
    interrupted = 0
    for _ in range(cycles):
        try:
            try:
                signal.setitimer(signal.ITIMER_REAL, rng.uniform(0.00005, most))
                memgov.claim("1GiB").release()
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)  # one-shot: it cannot fire again after
        except KeyboardInterrupt:
            interrupted += 1
        held = memgov.current()
        if held is not None:  # interrupted after the claim was made: released like a user would
            held.release()
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
            }
        )
    )


if __name__ == "__main__":
    main()
