"""A process that forks at a bad moment: python forker.py MODE.

wait-fork: a thread waits in claim(wait=60) while the main thread forks (os.fork); the child
    reports its pid and the ledger descriptors it has, then sleeps.
c-fork: claim 8GiB, then fork through libc (no Python at-fork hook runs in the child); the
    child sleeps holding copies of every descriptor, the parent's lock included.
Prints {"child": PID, ...} lines; the test SIGKILLs this process.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import threading
import time

import memgov
from memgov import _flock


def say(**data: object) -> None:
    os.write(1, (json.dumps(data) + "\n").encode())


def main() -> None:
    mode = sys.argv[1]
    if mode == "wait-fork":
        waiter = threading.Thread(target=lambda: memgov.claim("8GiB", wait=60), daemon=True)
        waiter.start()
        time.sleep(1.0)  # the thread is queued: its ticket is locked
        pid = os.fork()
        if pid == 0:
            held = memgov.current() is not None
            say(child=os.getpid(), ledger_files=_flock.open_count(), held=held)
            time.sleep(120)
            os._exit(0)
        say(parent=os.getpid(), forked=pid)
    else:
        memgov.claim("8GiB", name="c-forker")
        libc = ctypes.CDLL(None, use_errno=True)
        pid = libc.fork()
        if pid == 0:
            time.sleep(120)
            os._exit(0)
        say(parent=os.getpid(), child=pid)
    time.sleep(120)


if __name__ == "__main__":
    main()
