"""The admission lock's edges: a filesystem without flock, a waiter that gives up or is
interrupted, a planted FIFO or folder, and a child forked while the lock is held."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import memgov
from memgov._files import flock as _flock
from memgov._files.flock import AdmissionLock
from memgov._ledger import records as _records
from memgov._ledger.ledger import new_record_name
from tests.helpers.procs import ledger, wait_until

pytestmark = pytest.mark.usefixtures("sim")
REAL_FLOCK = fcntl.flock


def no_flock(fd: int, op: int) -> None:
    raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))


def free(path: Path) -> bool:
    """Whether nobody holds the flock of PATH (probed on a fresh open file, then let go)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        REAL_FLOCK(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def left_nothing_behind(lock_path: Path, busy: int) -> None:
    """The waiter that gave up holds no descriptor: once the holder lets go, the lock is free."""
    assert _flock.open_count() == 0
    os.close(busy)
    assert free(lock_path)


@pytest.fixture
def lock_path(tmp_path: Path) -> Path:
    return tmp_path / "admission.lock"


@pytest.fixture
def busy(lock_path: Path) -> Iterator[int]:
    """Another open file of the lock holds it until the test lets go (os.close)."""
    lock_path.touch()
    fd = os.open(lock_path, os.O_RDONLY)
    REAL_FLOCK(fd, fcntl.LOCK_EX)
    yield fd
    with contextlib.suppress(OSError):  # the test may have let go already
        os.close(fd)


def test_filesystem_without_flock_is_a_clear_ledger_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Simulated in-process: NFS without lockd, or a FUSE filesystem, answers flock with ENOLCK.
    monkeypatch.setattr(fcntl, "flock", no_flock)
    with pytest.raises(memgov.LedgerError, match=r"filesystem does not support flock.*local"):
        memgov.claim("1GiB")
    assert memgov.current() is None


def test_record_probe_without_flock_is_a_clear_ledger_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ledger().snapshot()  # the folders exist
    name = new_record_name()  # a record's name: other names are not opened
    fd = os.open(ledger().path / "claims" / name, os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, b"{}")  # not empty: an empty file is known to be no record without a probe
    os.close(fd)

    def shared_fails(fd: int, op: int) -> None:
        if op & fcntl.LOCK_SH:
            no_flock(fd, op)
        REAL_FLOCK(fd, op)

    monkeypatch.setattr(fcntl, "flock", shared_fails)
    with pytest.raises(memgov.LedgerError, match="filesystem does not support flock"):
        ledger().snapshot()  # not a guess that the holder is alive (or dead)
    with (
        _flock.open_dir(ledger().path, ("claims",), create=False) as folder,
        pytest.raises(memgov.LedgerError, match="does not support flock"),
    ):
        _records.scan(folder)


def test_waiter_times_out_naming_the_holder_and_leaves_nothing(lock_path: Path, busy: int) -> None:
    threads = threading.active_count()
    started = time.monotonic()
    with (
        pytest.raises(memgov.LedgerError, match=f"held for over 0.2 s by pid {os.getpid()}"),
        AdmissionLock(lock_path, timeout=0.2),
    ):
        pass
    assert time.monotonic() - started < 5
    assert threading.active_count() == threads  # no helper thread: nothing blocks in flock
    left_nothing_behind(lock_path, busy)


def test_interrupted_waiter_leaves_no_lock_behind(
    lock_path: Path, busy: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(seconds: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(_flock.time, "sleep", interrupted)
    with pytest.raises(KeyboardInterrupt), AdmissionLock(lock_path, timeout=30):
        pass
    monkeypatch.undo()
    left_nothing_behind(lock_path, busy)


def test_failing_flock_is_reported_at_once(
    lock_path: Path, busy: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fcntl, "flock", no_flock)
    started = time.monotonic()
    with (
        pytest.raises(memgov.LedgerError, match="does not support flock"),
        AdmissionLock(lock_path, timeout=30),
    ):
        pass
    assert time.monotonic() - started < 10  # not the 30 s timeout's misleading message
    assert _flock.open_count() == 0


def test_planted_fifo_or_folder_as_lock_fails_at_once(lock_path: Path) -> None:
    os.mkfifo(lock_path)  # open() of a FIFO without a writer would block forever
    started = time.monotonic()
    with (
        pytest.raises(memgov.LedgerError, match="not a regular file"),
        AdmissionLock(lock_path, timeout=30),
    ):
        pass
    lock_path.unlink()
    lock_path.mkdir()
    with (
        pytest.raises(memgov.LedgerError, match="a folder was put there"),
        AdmissionLock(lock_path, timeout=30),
    ):
        pass
    assert time.monotonic() - started < 5
    assert _flock.open_count() == 0


def test_child_forked_while_the_lock_is_held_does_not_keep_it(lock_path: Path) -> None:
    with AdmissionLock(lock_path, timeout=5):
        pid = os.fork()
        if pid == 0:  # the child outlives the parent's lock by far
            time.sleep(60)
            os._exit(0)
    try:
        wait_until(lambda: free(lock_path), timeout=3)  # the child closes its copy at fork
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def test_new_record_waits_for_a_scanner_probing_its_temporary_file(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A scanner lists temporary files too and probes them with a shared lock; when that probe
    # lands between a writer's open and its exclusive lock, the writer must wait it out, not
    # fail the claim (seen about once in 30 runs of the churn test before the fix).
    probed = threading.Event()

    def scanner_probes_first(fd: int, op: int) -> Any:
        path = os.readlink(f"/proc/self/fd/{fd}")
        if op & fcntl.LOCK_EX and _flock.TMP_PREFIX in path and not probed.is_set():
            probed.set()
            probe = os.open(path, os.O_RDONLY)
            REAL_FLOCK(probe, fcntl.LOCK_SH | fcntl.LOCK_NB)
            threading.Timer(0.05, os.close, (probe,)).start()  # the probe lets go soon after
        return REAL_FLOCK(fd, op)

    monkeypatch.setattr(_records.fcntl, "flock", scanner_probes_first)
    with memgov.claim("1GiB") as held:
        assert probed.is_set()
        assert held.record.endswith(".json")
