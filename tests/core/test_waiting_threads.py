"""Waiting does not hold up what it should not: another thread's claim, or a device the request
can never fit (fairness)."""

from __future__ import annotations

import threading
from typing import Any

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


def test_two_threads_entering_together_never_both_claim(monkeypatch: pytest.MonkeyPatch) -> None:
    # The interleaving a review found: thread A takes its number, then thread B enters and
    # looks before A has entered. B goes on; A, entering after, must see B and step back
    # (the code before let both go on). weakref.ref is where A is held, between the two.
    from memgov import _claim

    real_ref = _claim.weakref.ref
    a_numbered, b_done = threading.Event(), threading.Event()

    class Held:  # weakref.ref for thread A only: it waits there until B has looked
        @staticmethod
        def ref(obj: object, callback: Any = None) -> object:
            if threading.current_thread().name == "A":
                a_numbered.set()
                b_done.wait(10)
            return real_ref(obj, callback)

    monkeypatch.setattr(_claim, "weakref", Held)
    outcome: dict[str, object] = {}
    kept: list[object] = []

    def attempt(name: str) -> None:
        try:
            kept.append(_claim._start_attempt())
            outcome[name] = "goes on"
        except memgov.MemgovError:
            outcome[name] = "steps back"
        finally:
            if name == "B":
                b_done.set()

    a = threading.Thread(target=attempt, args=("A",), name="A")
    a.start()
    assert a_numbered.wait(10)
    b = threading.Thread(target=attempt, args=("B",), name="B")
    b.start()
    b.join(10)
    a.join(10)
    assert outcome == {"B": "goes on", "A": "steps back"}
    kept.clear()
    assert not _claim._claiming  # each entry went with its attempt


def test_an_attempt_an_interrupt_left_alive_does_not_refuse_the_next_claim() -> None:
    # Ctrl-C inside claim() in a notebook: the traceback (sys.last_traceback) keeps the
    # interrupted attempt alive. The same thread's next claim() must not be refused as if
    # another thread were claiming; another thread meanwhile is (one claim() at a time).
    from memgov import _claim

    left = _claim._start_attempt()  # as a kept traceback would hold it
    again = _claim._start_attempt()
    refused: list[BaseException] = []

    def other() -> None:
        try:
            _claim._start_attempt()
        except memgov.MemgovError as exc:
            refused.append(exc)

    thread = threading.Thread(target=other)
    thread.start()
    thread.join(10)
    assert len(refused) == 1
    del left, again
    assert not _claim._claiming
