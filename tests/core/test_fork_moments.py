"""A fork at the worst moment (docs/ledger.md, "Forked children"): while another thread holds one
of memgov's locks, or holds a probe's shared lock on a ledger file. The child must neither wait
forever on a lock no thread of its own holds, nor keep the probe's lock. Real processes: the
forking program runs in its own interpreter, and the child reports through its exit status."""

from __future__ import annotations

import subprocess
import sys

import pytest

LOCKS_HELD_AT_FORK = """
import os, signal, threading
from memgov import _adapters, _autoenable, _importhook, _nvml, _threads

_importhook.when_imported("memgov_never_imported", lambda module: None)  # the finder is in
held, done = threading.Event(), threading.Event()

def hold():
    with _importhook._lock, _threads._lock, _nvml._lock, _autoenable._lock, _adapters._lock:
        held.set()
        done.wait()

threading.Thread(target=hold, daemon=True).start()
held.wait()
pid = os.fork()
if pid == 0:
    signal.alarm(20)  # a child stuck on a lock dies of SIGALRM instead of hanging the test
    import colorsys  # asks memgov's finder, which takes _importhook's lock
    for lock in (_threads._lock, _nvml._lock, _autoenable._lock, _adapters._lock):
        with lock:
            pass
    os._exit(0)
done.set()
print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"""


def test_child_forked_while_a_thread_holds_memgovs_locks_does_not_hang() -> None:
    result = subprocess.run(
        [sys.executable, "-c", LOCKS_HELD_AT_FORK], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "0", f"child ended with {result.stdout.strip()} (-14: SIGALRM)"


PROBE_HELD_AT_FORK = """
import fcntl, os, sys, threading
from memgov import _config, _cpushare, _records
from memgov._devices import candidates
from memgov._ledger import DeviceLedger

if sys.argv[1] == "cpu":  # a CPU-share record (memgov/_cpushare.py), read by peers()
    # Probed by _records's reader, as claim records are.
    folder, module = _config.ledger_dir().joinpath(*_cpushare.PARTS), _records
    scan = lambda: _cpushare.peers(clean=False)
else:  # a claim record (memgov/_records.py), read by the device ledger's scan
    ledger = DeviceLedger(candidates(None)[0])
    folder, module = ledger.path / "claims", _records
    scan = lambda: ledger.scan(clean=False)
folder.mkdir(parents=True)
dead = folder / f"{1:020d}-{'0' * 12}{_records.SUFFIX}"
dead.write_text("{}")  # a record nobody holds: a probe takes its shared lock

probing, forked = threading.Event(), threading.Event()

class Shim:  # the module's fcntl: its probe pauses while it holds the shared lock
    def __getattr__(self, name):
        return getattr(fcntl, name)

    def flock(self, fd, op):
        fcntl.flock(fd, op)
        if op & fcntl.LOCK_SH:
            probing.set()
            forked.wait()

module.fcntl = Shim()
threading.Thread(target=scan, daemon=True).start()
probing.wait()
pid = os.fork()
if pid == 0:
    inode = os.stat(dead).st_ino
    mine = [fd for fd in os.listdir("/proc/self/fd") if os.path.exists(f"/proc/self/fd/{fd}")
            and os.stat(f"/proc/self/fd/{fd}").st_ino == inode]
    os._exit(len(mine))
forked.set()
print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"""


@pytest.mark.parametrize("record", ["cpu", "claims"])
def test_child_forked_during_a_record_probe_keeps_no_lock(record: str, sim: str) -> None:
    result = subprocess.run(
        [sys.executable, "-c", PROBE_HELD_AT_FORK, record],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "0", "the child holds the probe's descriptor (and its lock)"
