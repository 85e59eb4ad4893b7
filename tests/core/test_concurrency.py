"""Many real processes claiming at once: exact admission counts, FIFO waiting, no over-commit and
no deadlock. A monitor thread samples the ledger under the admission lock the whole time."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import memgov
from memgov._ledger.ledger import DeviceLedger
from tests.helpers.procs import Child, Monitor, ledger, wait_until

GIB = 2**30
pytestmark = pytest.mark.usefixtures("sim")


@pytest.fixture
def monitor() -> Iterator[Monitor]:
    watcher = Monitor("sim0")
    watcher.start()
    yield watcher
    watcher.stop()
    assert watcher.violations == []


def test_twenty_claimers_sixteen_admitted_without_waiting(
    children: list[Child], monitor: Monitor
) -> None:
    children.extend(Child(["4GiB", "--hold", "stdin"]) for _ in range(20))
    first = [child.next() for child in children]
    outcomes = sorted(event["event"] for event in first)
    assert outcomes == ["admitted"] * 16 + ["refused"] * 4, first
    refusals = [event["message"] for event in first if event["event"] == "refused"]
    assert all("free budget 0 B of 64.00 GiB" in message for message in refusals)
    snap = monitor.sample()
    assert snap.claimed == 64 * GIB and len(snap.claims) == 16
    for child in children:
        child.release()
    for child, event in zip(children, first, strict=True):
        assert child.proc.wait(timeout=30) == (0 if event["event"] == "admitted" else 3)
    monitor.stop()
    assert monitor.max_claimed == 64 * GIB and monitor.violations == []
    assert ledger().snapshot().claims == []


def test_twenty_waiting_claimers_all_finish_in_turn(
    children: list[Child], monitor: Monitor
) -> None:
    children.extend(Child(["4GiB", "--wait", "120", "--hold", "stdin"]) for _ in range(20))
    # Sixteen hold 4 GiB each of 64, so four queue: seen before anyone lets go (a fixed hold
    # could end before the last ones, slow to start on a loaded host, even asked).
    book = ledger()
    wait_until(lambda: (len((s := book.snapshot()).claims), len(s.queue)) == (16, 4), timeout=120)
    for child in children:
        child.release()  # read once admitted: the four queued hold until their turn, then go
    admitted = [child.expect("admitted", timeout=60) for child in children]
    released = [child.expect("released", timeout=60) for child in children]
    assert all(child.proc.wait(timeout=30) == 0 for child in children)
    assert len(admitted) == len(released) == 20
    monitor.stop()
    # Each of the 20 got its turn: never more than 16 held at once, and four had to queue.
    assert monitor.max_claims <= 16 and monitor.max_queue >= 1
    assert monitor.max_claimed <= 64 * GIB and monitor.violations == []
    snap = ledger().snapshot()
    assert snap.claims == [] and snap.queue == []


def held_and_queued(
    children: list[Child], name: str, wait: str
) -> tuple[DeviceLedger, Child, Child]:
    """sim0's ledger with a 60 GiB holder admitted and a 32 GiB claim ``name`` queued behind it."""
    book = ledger()
    holder = Child(["60GiB", "--name", "holder"])
    children.append(holder)
    holder.expect("admitted")
    queued = Child(["32GiB", "--wait", wait, "--name", name])
    children.append(queued)
    wait_until(lambda: len(book.snapshot().queue) == 1)
    return book, holder, queued


def test_waiting_is_first_come_first_served(children: list[Child], monitor: Monitor) -> None:
    book, holder, big = held_and_queued(children, "big", wait="30")
    small = [Child(["4GiB", "--wait", "30", "--name", f"small{i}"]) for i in range(3)]
    children.extend(small)
    wait_until(lambda: len(book.snapshot().queue) == 4)
    # 4 GiB is free, so each small request fits, but the big one queued first: none may pass it.
    with pytest.raises(memgov.BudgetExceeded, match="1 claim") as info:
        memgov.claim("1GiB")  # not waiting at all does not jump the queue either
    assert info.value.queued_ahead == 4
    queue = [q.name for q in book.snapshot().queue]
    assert queue[0] == "big" and sorted(queue[1:]) == ["small0", "small1", "small2"]
    assert all(child.events.empty() for child in [big, *small])
    holder.release()
    first = big.expect("admitted")
    later = [child.expect("admitted") for child in small]
    assert all(first["record"] < event["record"] for event in later)  # admission order
    snap = monitor.sample()
    assert sorted(c.name for c in snap.claims) == ["big", "small0", "small1", "small2"]
    for child in [big, *small]:
        child.release()
        child.expect("released")


def test_no_deadlock_and_no_over_commit_under_churn(
    children: list[Child], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEMGOV_DEVICES", "sim0:16GiB,sim1:16GiB")
    monitors = [Monitor("sim0"), Monitor("sim1")]
    for watcher in monitors:
        watcher.start()
    sizes = ["2GiB", "4GiB", "8GiB", "12GiB", "16GiB"]
    devices = ["auto", "0", "1"]
    for i in range(10):
        children.append(
            Child(
                [
                    sizes[i % len(sizes)],
                    "--device",
                    devices[i % len(devices)],
                    "--wait",
                    "60",
                    "--hold",
                    "0.02",
                    "--cycles",
                    "5",
                ]
            )
        )
    try:
        for child in children:
            code = child.proc.wait(timeout=90)
            assert code == 0, f"{list(child.events.queue)} {''.join(child.stderr)}"
    finally:
        for watcher in monitors:
            watcher.stop()
    events = [child.next() for child in children for _ in range(10)]
    assert sum(e["event"] == "admitted" for e in events) == 50
    assert all(watcher.violations == [] for watcher in monitors)
    assert all(watcher.samples > 0 for watcher in monitors)
    for uuid in ("sim0", "sim1"):
        snap = ledger(uuid).snapshot()
        assert snap.claims == [] and snap.queue == []


def test_a_stopped_waiter_is_passed_over_and_queues_again_once_resumed(
    children: list[Child], monitor: Monitor
) -> None:
    book, holder, ahead = held_and_queued(children, "ahead", wait="120")
    stopped = Child(["32GiB", "--wait", "120", "--name", "stopped"])
    children.append(stopped)
    wait_until(lambda: len(book.snapshot().queue) == 2)
    first_ticket = book.snapshot().queue[1].record
    # Stopped while behind another waiter, so not while it holds the admission lock (a stopped
    # holder of that lock is another bound: LOCK_TIMEOUT_S); then the one ahead goes.
    os.kill(stopped.proc.pid, signal.SIGSTOP)
    try:
        ahead.kill()
        holder.release()
        holder.expect("released")
        # The device is empty but for the stopped waiter's ticket at the head of its queue:
        # once it has gone untouched for STOPPED_WAITER_S, the claims behind it get in.
        late = Child(["40GiB", "--wait", "40", "--hold", "stdin", "--name", "late"])
        children.append(late)
        late.expect("admitted", timeout=60)
        with memgov.claim("1GiB"):  # a claim that does not wait counts no stopped waiter ahead
            pass
    finally:
        os.kill(stopped.proc.pid, signal.SIGCONT)
    # Resumed, it lost its place: it queues again (a new ticket) behind what passed it.
    wait_until(  # as long as the admissions' expects: one poll of a resumed process, loaded host
        lambda: (
            [q.record for q in book.snapshot().queue if q.name == "stopped"]
            not in ([], [first_ticket])
        ),
        timeout=60,
    )
    assert stopped.events.empty()
    late.release()
    stopped.expect("admitted", timeout=60)
    stopped.release()
    stopped.expect("released")


_LOCK_BOUND_CLAIMER = """
import sys
import memgov
from memgov._base import config as _config
_config.LOCK_TIMEOUT_S = float(sys.argv[1])  # the bound of one holder, short for the test
sys.stdin.readline()
try:
    memgov.claim("1GiB").release()
    print("admitted", flush=True)
except memgov.BudgetExceeded as exc:
    print("refused", exc, flush=True)
except memgov.LockTimeout as exc:
    print("lock-timeout", exc, flush=True)
"""


def test_claims_on_a_busy_host_never_fail_for_the_lock_taken_in_turn(tmp_path: Path) -> None:
    # A loaded host: twice as many CPU burners as cores, then 60 claims at once that do not
    # wait, each taking the admission lock in turn. With a bound of 0.5 s for the lock, the
    # last ones wait longer than that for it, held by one running claimer after another: none
    # of those is stuck, so none may fail with LockTimeout (nor blame a stopped process).
    burners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(2 * (os.cpu_count() or 1))
    ]
    claimers: list[subprocess.Popen[str]] = []
    try:
        claimers = [
            subprocess.Popen(
                [sys.executable, "-c", _LOCK_BOUND_CLAIMER, "0.5"],  # 10 bounds: 5 s
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                cwd=tmp_path,  # memgov from the environment, not a memgov/ in the current folder
            )
            for _ in range(60)
        ]
        for proc in claimers:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        said = [proc.communicate(timeout=600)[0].strip() for proc in claimers]
    finally:
        for burner in burners:
            burner.kill()
            burner.wait(timeout=30)
        for proc in claimers:
            proc.kill()
            proc.wait(timeout=30)
    assert [s for s in said if not s.startswith("admitted")] == []
