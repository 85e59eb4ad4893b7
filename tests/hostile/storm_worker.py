"""One process of the interrupt storm: python storm_worker.py SECONDS SEED.

Threads claim and release (wait= or not) while exceptions are injected into them at random
points inside memgov: from a trace function at random lines of memgov's code, and as asynchronous
exceptions (PyThreadState_SetAsyncExc, what a signal handler raising does) at random moments.
A watcher thread keeps descriptors of its own and checks that nobody closes or replaces them.
At the end it reports what it saw as one JSON line, then waits on stdin (so the test can check
the ledger while this process is still alive), then checks that a normal claim still works.
"""

from __future__ import annotations

import ctypes
import faulthandler
import gc
import json
import os
import random
import shutil
import sys
import tempfile
import threading
import time
import traceback

import memgov
from memgov._files import flock as _flock

MEMGOV_DIR = os.path.dirname(os.path.abspath(memgov.__file__))


class Injected(BaseException):
    """Stands for KeyboardInterrupt / SIGTERM-as-exception: not an Exception, like those."""


running = True
counts = {"claims": 0, "injected_trace": 0, "injected_async": 0, "errors": 0, "refused": 0}
inside: dict[int, bool] = {}
kinds: dict[str, int] = {}


def tracer(rng: random.Random, rate: float):
    def trace(frame, event, arg):
        if not frame.f_code.co_filename.startswith(MEMGOV_DIR):
            return trace if event == "call" else None
        if event == "line" and rng.random() < rate:
            counts["injected_trace"] += 1
            raise Injected("trace")
        return trace

    return trace


def claimer(seed: int) -> None:
    rng = random.Random(seed)
    me = threading.get_ident()
    while running:
        try:
            sys.settrace(tracer(rng, 0.003) if rng.random() < 0.5 else None)
            inside[me] = True
            try:
                held = memgov.claim(f"{rng.randint(1, 3)}GiB", wait=rng.choice([None, 0.05, 0.3]))
                counts["claims"] += 1
                time.sleep(rng.uniform(0, 0.01))
                held.release()
            finally:
                inside[me] = False
                sys.settrace(None)
                # An exception that lands after claim() returned, before release(), leaves the
                # claim held, as in any program: released here (what a `with` block does).
                current = memgov.current()
                if current is not None:
                    current.release()
        except memgov.BudgetExceeded:
            counts["refused"] += 1
        except Injected:
            counts["errors"] += 1
        except memgov.MemgovError as exc:
            counts["errors"] += 1
            kind = f"{type(exc).__name__}: {str(exc)[:40]}"
            kinds[kind] = kinds.get(kind, 0) + 1
            time.sleep(0.001)
        except BaseException as exc:
            counts["errors"] += 1
            counts.setdefault("unexpected", 0)
            counts["unexpected"] += 1
            where = traceback.extract_tb(exc.__traceback__)[-1]  # the test's report names it
            kind = f"unexpected {type(exc).__name__}: {str(exc)[:60]} at {where.name}"
            kind += f":{where.lineno}"
            kinds[kind] = kinds.get(kind, 0) + 1


def injector(seed: int, threads: list[threading.Thread]) -> None:
    rng = random.Random(seed)
    while running:
        time.sleep(rng.uniform(0.002, 0.02))
        target = rng.choice(threads)
        if inside.get(target.ident or 0):
            ctypes.pythonapi.PyThreadState_SetAsyncExc(
                ctypes.c_ulong(target.ident or 0), ctypes.py_object(Injected)
            )
            counts["injected_async"] += 1


def watcher(found: list[str]) -> None:
    """Owns descriptors and churns descriptor numbers; any change to its own is a foreign touch."""
    folder = tempfile.mkdtemp(prefix="memgov-storm-")
    path = os.path.join(folder, "mine")
    with open(path, "w") as f:
        f.write("x")
    mine = [os.open(path, os.O_RDONLY) for _ in range(4)]
    inode = os.fstat(mine[0]).st_ino
    while running:
        churn = os.open(path, os.O_RDONLY)  # takes the lowest free number, like claim() does
        os.close(churn)
        for fd in mine:
            try:
                if os.fstat(fd).st_ino != inode:
                    found.append(f"fd {fd} now refers to another file")
            except OSError as exc:
                found.append(f"fd {fd}: {exc}")
        time.sleep(0.0005)
    for fd in mine:
        os.close(fd)
    shutil.rmtree(folder, ignore_errors=True)  # a test leaves no temporary folder behind


def main() -> None:
    global running
    seconds, seed = float(sys.argv[1]), int(sys.argv[2])
    memgov.claim("1GiB", wait=60).release()  # imports and folders, before the storm
    threads = [threading.Thread(target=claimer, args=(seed * 10 + i,)) for i in range(3)]
    foreign: list[str] = []
    helpers = [threading.Thread(target=watcher, args=(foreign,))]
    for t in threads + helpers:
        t.start()
    inject = threading.Thread(target=injector, args=(seed, threads))
    inject.start()
    time.sleep(seconds)
    running = False
    for t in [inject, *threads, *helpers]:
        t.join(timeout=10)
    if any(t.is_alive() for t in threads):
        faulthandler.dump_traceback(all_threads=True)  # a finding: say where it is stuck
    gc.collect()
    with open("/proc/locks") as table:
        mine = [ln for ln in table.read().splitlines() if ln.split()[4:5] == [str(os.getpid())]]
    alive = sum(t.is_alive() for t in threads)
    report = {
        **counts,
        "kinds": kinds,
        "foreign": foreign,
        "alive_threads": alive,
        "held": memgov.current() is not None,
        "open_ledger_files": _flock.open_count(),
        "my_locks": len(mine),
        "my_lock_lines": mine,
    }
    print(json.dumps(report), flush=True)
    sys.stdin.readline()  # the test checks the ledger now
    with memgov.claim("1GiB", wait=30):  # nothing stuck: a normal claim still works
        print(json.dumps({"after": "ok"}), flush=True)


if __name__ == "__main__":
    main()
