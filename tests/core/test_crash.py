"""Holders that die: SIGKILL (also inside a PID namespace), forked children, dead waiters, exits.

Liveness is the record's flock, which the kernel drops when the holder dies, so each test asserts
that the budget is free on the very first try after the holder is reaped: no sleep, no retry.
(How fast that is, is measured by benchmarks/cpu/core_checks.py, not asserted here.)
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys

import psutil
import pytest

import memgov
from memgov._ledger.attribution import pidns_of
from tests.helpers.procs import Child, ledger, wait_until

GIB = 2**30
pytestmark = pytest.mark.usefixtures("sim")


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def test_sigkilled_holder_frees_its_budget_at_once(children: list[Child]) -> None:
    holder = Child(["64GiB", "--hold", "forever"])
    children.append(holder)
    holder.expect("admitted")
    with pytest.raises(memgov.BudgetExceeded):
        memgov.claim("1GiB")
    holder.kill()
    assert holder.proc.wait(timeout=10) == -signal.SIGKILL
    with memgov.claim("64GiB"):  # first try, right after the holder is reaped
        pass
    assert ledger().snapshot().removed == []  # its record was already swept by that claim


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="unshare --pid needs root (CAP_SYS_ADMIN)")
@pytest.mark.skipif(shutil.which("unshare") is None, reason="util-linux unshare is not installed")
def test_sigkilled_holder_in_its_own_pid_namespace(children: list[Child]) -> None:
    holder = Child(
        ["64GiB", "--hold", "forever"], prefix=["unshare", "--pid", "--fork", "--mount-proc"]
    )
    children.append(holder)
    got = holder.expect("admitted")
    assert got["pid"] == 1 and got["pidns"] != pidns_of()  # it is init of a new namespace
    [claim] = ledger().snapshot().claims
    assert (claim.pid, claim.pidns) == (1, got["pidns"])
    [inner] = psutil.Process(holder.proc.pid).children()
    os.kill(inner.pid, signal.SIGKILL)
    holder.proc.wait(timeout=10)  # unshare exits once the namespace's init is gone
    assert not psutil.pid_exists(inner.pid)
    with memgov.claim("64GiB"):
        pass


def test_forked_child_does_not_keep_a_killed_parents_claim(children: list[Child]) -> None:
    parent = Child(["64GiB", "--fork", "sleep", "--hold", "forever"])
    children.append(parent)
    parent.expect("admitted")
    events = {e["event"]: e for e in (parent.next(), parent.next())}
    grandchild = events["forked"]["child"]
    assert events["child-ready"]["pid"] == grandchild  # its at-fork hook has run
    try:
        parent.kill()
        parent.proc.wait(timeout=10)
        assert psutil.Process(grandchild).status() != psutil.STATUS_ZOMBIE
        with memgov.claim("64GiB"):  # the live child holds no copy of the lock
            pass
    finally:
        _kill(grandchild)


def test_forked_child_leaving_its_with_block_does_not_release_the_parents_claim(
    children: list[Child],
) -> None:
    parent = Child(["8GiB", "--fork", "release", "--hold", "stdin"])
    children.append(parent)
    parent.expect("admitted")
    events = {parent.next()["event"] for _ in range(3)}
    assert events == {"forked", "child-ready", "child-released"}
    grandchild = next(p.pid for p in psutil.Process(parent.proc.pid).children())
    try:
        [claim] = ledger().snapshot().claims
        assert (claim.pid, claim.bytes) == (parent.proc.pid, 8 * GIB)
        with pytest.raises(memgov.BudgetExceeded):
            memgov.claim("57GiB")
        parent.release()
        parent.expect("released")
        assert ledger().snapshot().claims == []
    finally:
        _kill(grandchild)


def test_killed_waiter_does_not_block_the_queue(children: list[Child]) -> None:
    book = ledger()
    holder = Child(["60GiB"])
    children.append(holder)
    holder.expect("admitted")
    head = Child(["32GiB", "--wait", "30"])
    children.append(head)
    wait_until(lambda: len(book.snapshot().queue) == 1)
    behind = Child(["4GiB", "--wait", "30", "--name", "behind"])
    children.append(behind)
    wait_until(lambda: len(book.snapshot().queue) == 2)
    assert behind.events.empty()  # FIFO: the big head of the queue blocks it
    head.kill()
    head.proc.wait(timeout=10)
    behind.expect("admitted")  # the dead waiter's ticket no longer counts
    snap = book.snapshot()
    assert sorted(c.bytes for c in snap.claims) == [4 * GIB, 60 * GIB] and snap.queue == []
    assert "behind" in [c.name for c in snap.claims]
    holder.release()
    behind.release()


def run(code: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "MEMGOV_HOLDER"}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env
    )


def test_exit_without_release_removes_the_record() -> None:
    result = run("import memgov; memgov.claim('8GiB'); raise SystemExit(0)")
    assert result.returncode == 0, result.stderr
    assert os.listdir(ledger().path / "claims") == []  # released at exit, not just dead


def test_uncaught_exception_still_releases() -> None:
    result = run("import memgov; memgov.claim('8GiB'); 1 / 0")
    assert "ZeroDivisionError" in result.stderr
    assert os.listdir(ledger().path / "claims") == []


def test_hard_exit_leaves_a_dead_record_that_holds_nothing() -> None:
    result = run("import os, memgov; memgov.claim('64GiB'); os._exit(0)")
    assert result.returncode == 0, result.stderr
    [left] = os.listdir(ledger().path / "claims")  # no atexit ran: the file stays, unlocked
    snap = ledger().scan(clean=False)
    assert snap.claims == [] and snap.free == 64 * GIB
    with memgov.claim("64GiB"):
        pass
    assert left not in os.listdir(ledger().path / "claims")


def test_a_claim_removes_a_dead_record_once_it_has_released_the_admission_lock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Removing a file no one holds needs no lock; under it, every claimer waits for the unlink.
    from memgov._files import flock as _flock
    from memgov._ledger import records as _records

    with memgov.claim("1GiB"):  # this process has looked at the ledger: no look ahead is due
        pass
    result = run("import os, memgov; memgov.claim('64GiB'); os._exit(0)")
    assert result.returncode == 0, result.stderr
    [left] = os.listdir(ledger().path / "claims")
    held, removals = [False], []
    enter, leave, remove_dead = (
        _flock.AdmissionLock.__enter__,
        _flock.AdmissionLock.__exit__,
        _records.remove_dead,
    )

    def entered(self: _flock.AdmissionLock) -> _flock.AdmissionLock:
        got = enter(self)
        held[0] = held[0] or self.path.name == "admission.lock"  # the device's (not a store's)
        return got

    def left_lock(self: _flock.AdmissionLock, *exc: object) -> None:
        held[0] = held[0] and self.path.name != "admission.lock"
        leave(self, *exc)

    def counted(folder_fd: int, seen: _records.Seen) -> str | None:
        removals.append(held[0])
        return remove_dead(folder_fd, seen)

    monkeypatch.setattr(_flock.AdmissionLock, "__enter__", entered)
    monkeypatch.setattr(_flock.AdmissionLock, "__exit__", left_lock)
    monkeypatch.setattr(_records, "remove_dead", counted)
    with memgov.claim("64GiB"):  # the dead record counts nothing: admitted at once
        assert left not in os.listdir(ledger().path / "claims")
    assert removals and not any(removals)  # [True] when removed under the lock
