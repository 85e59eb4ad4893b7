"""Many real processes claiming at once: exact admission counts, FIFO waiting, no over-commit and
no deadlock. A monitor thread samples the ledger under the admission lock the whole time."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import memgov
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


def test_waiting_is_first_come_first_served(children: list[Child], monitor: Monitor) -> None:
    book = ledger()
    holder = Child(["60GiB", "--name", "holder"])
    children.append(holder)
    holder.expect("admitted")
    big = Child(["32GiB", "--wait", "30", "--name", "big"])
    children.append(big)
    wait_until(lambda: len(book.snapshot().queue) == 1)
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
