"""A process that forks at a bad moment: python forker.py MODE.

wait-fork: a thread waits in claim(wait=60) while the main thread forks (os.fork); the child
    reports its pid and the ledger descriptors it has, then sleeps.
c-fork: claim 8GiB, then fork through libc (no Python at-fork hook runs in the child); the
    child sleeps holding copies of every descriptor, the parent's lock included.
storm FORKS: a thread makes this process's first claim while the main thread forks FORKS
    times, back to back, for as long as that claim lasts; each child reports the ledger
    descriptors it has and whether it holds a claim, claims 1GiB of its own, releases it, says
    so and sleeps (a child stuck in its claim says nothing more, keeping what it was admitted).
    The parent releases its claim and says {"parent": PID, "forked": [PIDs], "ledger": [...]}.
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
from memgov._cpu import threads as _threads
from memgov._files import flock as _flock


def say(**data: object) -> None:
    os.write(1, (json.dumps(data) + "\n").encode())


def own_share() -> str | None:
    """This process's CPU-share record (held for the process's life by design), if it has one."""
    held = getattr(_threads._state.get("registration"), "held", None)
    return os.path.realpath(held.path) if held is not None else None


def ledger_descriptors() -> list[str]:
    """This process's descriptors into the ledger folder, but for its own CPU-share record; each
    as "fd -> target"."""
    root = os.path.realpath(os.environ["MEMGOV_DIR"])
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # the listing's own descriptor, closed by now
        if (target == root or target.startswith(root + "/")) and target != own_share():
            found.append(f"{fd} -> {target}")
    return found


def storm(forks: int) -> None:
    # claim() itself imported before the threads, as a program's imports at its top are: a fork
    # while another thread imports any module (memgov's claim too) leaves that module's import
    # lock held in the child; what claim() imports after that is memgov's to keep out.
    claim = memgov.claim
    first = threading.Thread(target=lambda: claims.append(claim("1GiB", name="parent")))
    claims: list[memgov.Claim] = []
    forked: list[int] = []
    first.start()
    while first.is_alive() and len(forked) < forks:
        pid = os.fork()
        if pid == 0:
            say(child=os.getpid(), ledger=ledger_descriptors(), held=memgov.current() is not None)
            claim("1GiB", name=f"child-{os.getpid()}").release()
            say(child=os.getpid(), claimed=True, ledger=ledger_descriptors(), share=own_share())
            time.sleep(120)
            os._exit(0)
        forked.append(pid)
    first.join()
    claims[0].release()
    say(parent=os.getpid(), forked=forked, ledger=ledger_descriptors())


def main() -> None:
    mode = sys.argv[1]
    if mode == "storm":
        storm(int(sys.argv[2]))
    elif mode == "wait-fork":
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
