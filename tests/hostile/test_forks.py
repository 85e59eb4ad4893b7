"""Fork semantics (docs/ledger.md, "Forked children"): a child never holds its parent's claim,
ticket or locks, whether it was forked while another thread waited or forked from C."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import memgov
from tests.helpers.procs import Child, ledger, wait_until

FORKER = Path(__file__).resolve().parent / "forker.py"
GIB = 2**30


@pytest.fixture(autouse=True)
def device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMGOV_DEVICES", "sim0:64GiB")


def locks_of(pid: int) -> list[str]:
    with open("/proc/locks") as table:
        return [ln for ln in table.read().splitlines() if ln.split()[4:5] == [str(pid)]]


def start(mode: str) -> tuple[subprocess.Popen[str], list[dict[str, int]]]:
    proc = subprocess.Popen(
        [sys.executable, str(FORKER), mode],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    lines = [json.loads(proc.stdout.readline()) for _ in range(2 if mode == "wait-fork" else 1)]
    return proc, lines


def test_child_forked_while_a_thread_waits_holds_no_ticket(children: list[Child]) -> None:
    full = Child(["60GiB"])
    children.append(full)
    full.expect("admitted")
    proc, lines = start("wait-fork")
    child = next(line for line in lines if "child" in line)
    try:
        assert child["ledger_files"] == 0 and child["held"] is False
        assert locks_of(child["child"]) == []  # the at-fork hook closed its copies
        proc.send_signal(signal.SIGKILL)  # the waiting parent dies: its ticket must go with it
        proc.wait(timeout=10)
        full.release()
        full.expect("released")
        with memgov.claim("1GiB") as held:  # not "queued ahead" behind a dead parent's ticket
            assert held.bytes == GIB
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def test_child_forked_from_c_does_not_keep_a_killed_parents_claim() -> None:
    proc, lines = start("c-fork")
    child = lines[0]["child"]
    try:
        assert ledger().snapshot().claimed == 8 * GIB
        assert locks_of(child) == []  # /proc/locks names the process that took the lock
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        assert os.path.exists(f"/proc/{child}")  # the child lives on, holding the descriptor
        wait_until(lambda: ledger().snapshot().claimed == 0, timeout=5)
        with memgov.claim("64GiB"):
            pass
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def ledger_targets(pid: int) -> list[str]:
    """What each descriptor of ``pid`` into the ledger folder points at (/proc/PID/fd)."""
    root = os.path.realpath(os.environ["MEMGOV_DIR"])
    found = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):  # closed meanwhile
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target == root or target.startswith(root + "/"):
                found.append(target)
    return found


def test_children_forked_during_the_first_claim_neither_hang_nor_hold_the_parents() -> None:
    """A fork storm from one thread while another makes the process's first claim: every child
    starts with none of its parent's ledger descriptors and no claim, makes a claim of its own
    and releases it (none waits for an import lock the claiming thread held at the fork, keeping
    what it was admitted), and keeps nothing of the ledger but its own CPU-share record; nor
    does the parent once it has released its claim."""
    proc = subprocess.Popen(
        [sys.executable, str(FORKER), "storm", "40"],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        # No follower thread: its own scans would show in a child's descriptors as it looks.
        env={**os.environ, "MEMGOV_THREADS": "once"},
    )
    lines: list[dict[str, Any]] = []
    threading.Thread(target=read_lines, args=(proc, lines), daemon=True).start()

    def children_done() -> bool:
        ends = [line["forked"] for line in lines if "parent" in line]
        return bool(ends) and len([line for line in lines if line.get("claimed")]) == len(ends[0])

    try:
        # A stuck child never says it is done: waited for far longer than a claim takes.
        deadline = time.monotonic() + 180
        while not children_done() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        parent = next(line for line in lines if "parent" in line)
        forked = parent["forked"]
        assert parent["ledger"] == [], "the parent keeps ledger files open after its release"
        assert len(forked) > 1, "the first claim ended before a second fork"
        started = {line["child"]: line for line in lines if "held" in line}
        done = {line["child"]: line for line in lines if line.get("claimed")}
        stuck = [pid for pid in forked if pid not in done]
        holders = [c.name for c in ledger().snapshot().claims]
        assert stuck == [], f"{len(stuck)} of {len(forked)} children stuck; held: {holders}"
        assert holders == [], "children hold the budget they were admitted"
        assert [c for c in started.values() if c["ledger"] or c["held"]] == []
        assert [c for c in done.values() if c["ledger"]] == []
        kept = {pid: [t for t in ledger_targets(pid) if t != done[pid]["share"]] for pid in forked}
        assert {pid: found for pid, found in kept.items() if found} == {}
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def read_lines(proc: subprocess.Popen[str], lines: list[dict[str, Any]]) -> None:
    """The storm's lines, the parent's and every child's, as they come."""
    assert proc.stdout is not None
    for text in proc.stdout:
        lines.append(json.loads(text))
