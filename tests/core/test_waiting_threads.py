"""Waiting does not hold up what it should not: another thread's claim, or a device the request
can never fit (fairness)."""

from __future__ import annotations

import threading

import pytest

import memgov
from tests.helpers.procs import Child, ledger, wait_until


def test_a_threads_claim_does_not_wait_behind_another_threads_wait(
    children: list[Child], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEMGOV_DEVICES", "sim0:16GiB")
    full = Child(["16GiB"])
    children.append(full)
    full.expect("admitted")
    outcome: dict[str, object] = {}

    def waiter() -> None:
        try:
            memgov.claim("8GiB", wait=30).release()
            outcome["waiter"] = "admitted"
        except memgov.MemgovError as exc:
            outcome["waiter"] = exc

    thread = threading.Thread(target=waiter)
    thread.start()
    wait_until(lambda: len(ledger().snapshot().queue) == 1)
    # Refused at once with why, instead of blocking for the other thread's 30 s.
    with pytest.raises(memgov.MemgovError, match="another thread of this process is claiming"):
        memgov.claim("1GiB")
    assert thread.is_alive()
    full.release()
    full.expect("released")
    thread.join(30)
    assert outcome["waiter"] == "admitted"


def test_an_auto_waiter_queues_only_where_it_can_ever_fit(
    children: list[Child], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEMGOV_DEVICES", "small:8GiB,big:64GiB")
    monkeypatch.setenv("MEMGOV_RESERVE", "50%")  # small's capacity: 4 GiB; big's: 32 GiB
    full = Child(["32GiB", "--device", "1"])
    children.append(full)
    full.expect("admitted")
    waiting = Child(["6GiB", "--device", "auto", "--wait", "30"])  # <= small's total, > capacity
    children.append(waiting)
    wait_until(lambda: len(ledger("big").snapshot().queue) == 1)
    assert ledger("small").snapshot().queue == []  # it never holds up a queue it cannot use
    with memgov.claim("4GiB", device="small"):
        pass
    full.release()
    full.expect("released")
    assert waiting.expect("admitted")["device"] == "big"
