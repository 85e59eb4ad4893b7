"""A fork at the worst moment (docs/ledger.md, "Forked children"): while another thread holds one
of memgov's locks, or holds a probe's shared lock on a ledger file. The child must neither wait
forever on a lock no thread of its own holds, nor keep the probe's lock. Real processes: the
forking program runs in its own interpreter, and the child reports through its exit status."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from memgov._base.errors import LedgerError

LOCKS_HELD_AT_FORK = """
import os, signal, threading
from memgov import _autoenable
from memgov._base import importhook as _importhook
from memgov._gpu import nvml as _nvml
from memgov._cpu import threads as _threads

_importhook.when_imported("memgov_never_imported", lambda module: None)  # the finder is in
held, done = threading.Event(), threading.Event()

def hold():
    with _importhook._lock, _threads._lock, _nvml._lock, _autoenable._lock:
        held.set()
        done.wait()

threading.Thread(target=hold, daemon=True).start()
held.wait()
pid = os.fork()
if pid == 0:
    signal.alarm(20)  # a child stuck on a lock dies of SIGALRM instead of hanging the test
    import colorsys  # asks memgov's finder, which takes _importhook's lock
    for lock in (_threads._lock, _nvml._lock, _autoenable._lock):
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
from memgov._base import config as _config
from memgov._cpu import share as _cpushare
from memgov._ledger import records as _records
from memgov._gpu.devices import candidates
from memgov._ledger.ledger import DeviceLedger

if sys.argv[1] == "cpu":  # a CPU-share record (memgov/_cpu/share.py), read by peers()
    # Probed by _records's reader, as claim records are.
    folder, module = _config.ledger_dir().joinpath(*_cpushare.PARTS), _records
    scan = lambda: _cpushare.peers(clean=False)
else:  # a claim record (memgov/_ledger/records.py), read by the device ledger's scan
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


LEDGER_FDS = """
def ledger_fds(root):
    found = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target == root or target.startswith(root + "/"):
                found += 1
        except OSError:
            pass  # the listing's own descriptor, closed by now
    return found
"""

STRAYS_HELD_AT_FORK = (
    """
import fcntl, os, threading
from memgov._base import config as _config
from memgov._files import flock as _flock

"""
    + LEDGER_FDS
    + """
root = str(_config.ledger_dir())
real = os.path.realpath(root)
held, forked, closed = threading.Event(), threading.Event(), threading.Event()

def hold():
    # Scans' folders (select.epoll owns them, no FileIO: one in v1/, one in mps/) and a file
    # another thread opened and locked without registering it: what a fork can find in the
    # middle of memgov's work.
    ledger = _config.ledger_dir()
    with _flock.open_dir(ledger, ("v1", "cpu"), create=True), _flock.open_dir(
        ledger, ("mps",), create=True
    ):
        record = os.path.join(real, "v1", "cpu", "probe")
        open(record, "w").close()
        fd = os.open(record, os.O_RDONLY | os.O_CLOEXEC)
        held.set()
        forked.wait()
        fcntl.flock(fd, fcntl.LOCK_SH)  # taken after the fork, on the open file both share
        os.close(fd)  # the parent lets go: the lock must go with it
    closed.set()

threading.Thread(target=hold).start()
held.wait()
mine = os.open(os.path.join(real, "mine.log"), os.O_WRONLY | os.O_CREAT)  # the user's own file
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(r)
    os.write(mine, b"child")
    os.write(w, bytes([ledger_fds(real) - 1]))  # all but the user's file
    import time
    time.sleep(30)  # alive while the parent probes the lock; killed then
    os._exit(0)
os.close(w)
forked.set()
strays = os.read(r, 1)[0]
closed.wait()
probe = os.open(os.path.join(real, "v1", "cpu", "probe"), os.O_RDONLY)
try:
    fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
    kept = 0
except BlockingIOError:
    kept = 1
os.kill(pid, 9)
os.waitpid(pid, 0)
print(strays, kept, open(os.path.join(real, "mine.log")).read())
"""
)


def test_child_forked_while_threads_hold_unregistered_ledger_descriptors_keeps_none() -> None:
    result = subprocess.run(
        [sys.executable, "-c", STRAYS_HELD_AT_FORK], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    strays, kept, written = result.stdout.split()
    assert strays == "0", "the child holds ledger descriptors other threads had open"
    assert kept == "0", "the child keeps the lock its parent's thread took after the fork"
    assert written == "child", "a file of the user's own in the ledger folder was taken away"


LOCK_OPEN_NOT_REGISTERED_AT_FORK = (
    """
import os, threading
from memgov._base import config as _config
from memgov._files import flock as _flock
from memgov._gpu.devices import candidates
from memgov._ledger.ledger import DeviceLedger

"""
    + LEDGER_FDS
    + """
ledger = DeviceLedger(candidates(None)[0])
real = os.path.realpath(_config.ledger_dir())
opened, forked = threading.Event(), threading.Event()
register = _flock._register

def paused(file):  # the admission lock is open, not yet known to the fork hook
    if os.readlink(f"/proc/self/fd/{file.fileno()}").endswith("admission.lock"):
        opened.set()
        forked.wait()
    register(file)

_flock._register = paused

def lock():
    with ledger.locked():
        pass

thread = threading.Thread(target=lock)
thread.start()
opened.wait()
pid = os.fork()
if pid == 0:
    os._exit(ledger_fds(real))
forked.set()
thread.join()
print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"""
)


def test_child_forked_between_a_files_open_and_its_registration_keeps_none(sim: str) -> None:
    """The admission lock opened by another thread, not yet owned by a registered FileIO when
    the fork comes: the child's hook cannot close what it does not know, and must find it."""
    result = subprocess.run(
        [sys.executable, "-c", LOCK_OPEN_NOT_REGISTERED_AT_FORK],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "0", "the child holds the parent's admission.lock descriptor"


FORK_STRAYS = Path(__file__).resolve().parents[2] / "benchmarks" / "cpu" / "fork_strays.py"


def forks_during_scans() -> str:
    """benchmarks/cpu/fork_strays.py's program: a claim, a thread scanning the CPU shares back to
    back, forks that count their ledger descriptors; prints how many children held one."""
    spec = importlib.util.spec_from_file_location("fork_strays", FORK_STRAYS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    program: str = module.RACE
    return program


def test_children_forked_while_a_thread_scans_the_ledger_hold_none_of_it(sim: str) -> None:
    """200 forks while another thread scans the CPU shares back to back (listings, folders,
    records probed): before each child cleared what it found, about 85 in 100 held one."""
    result = subprocess.run(
        [sys.executable, "-c", forks_during_scans(), "200"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "0", f"{result.stdout.strip()} of 200 children held some"


OWN_LEDGER_FILE_AT_FORK = (
    """
import os
from memgov._base import config as _config
from memgov._files import flock as _flock

"""
    + LEDGER_FDS
    + """
with _flock.open_dir(_config.ledger_dir(), ("v1", "_queue"), create=True):
    pass  # this process has used the ledger; no ledger operation is in progress below
real = os.path.realpath(_config.ledger_dir())
log = os.open(os.path.join(real, "v1", "_queue", "job.log"), os.O_WRONLY | os.O_CREAT)
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.write(log, b"child")
    os.write(w, bytes([ledger_fds(real)]))
    os._exit(0)
os.close(w)
print(os.read(r, 1)[0], open(os.path.join(real, "v1", "_queue", "job.log")).read())
os.waitpid(pid, 0)
"""
)


def test_a_fork_outside_any_ledger_operation_leaves_the_programs_own_descriptors() -> None:
    """Strays exist only while a ledger operation is in progress; a fork at any other moment
    searches nothing, so a ledger file the program itself opened (a job's log it hands on)
    stays the child's."""
    result = subprocess.run(
        [sys.executable, "-c", OWN_LEDGER_FILE_AT_FORK], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["1", "child"]


def test_a_ledger_operation_that_fails_or_is_interrupted_leaves_no_count_behind(
    private_ledger: Path,
) -> None:
    """Forks search for strays only while a ledger operation is counted in progress; one that
    ends by an exception (an interrupt is one) must take its count with it, or every later fork
    would search and blank the program's own ledger files."""
    from memgov._files import flock as _flock

    for error in (RuntimeError, KeyboardInterrupt):
        with pytest.raises(error), _flock.open_dir(private_ledger, ("v1",), create=True):
            assert _flock._inside, "the operation is not counted while it runs"
            raise error
        assert _flock._inside == []
    with pytest.raises(LedgerError), _flock.open_dir(Path("relative/ledger"), ("v1",), True):
        pass  # refused before anything is opened
    assert _flock._inside == []
