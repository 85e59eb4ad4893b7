"""Fork semantics (docs/ledger.md, "Forked children"): a child never holds its parent's claim,
ticket or locks, whether it was forked while another thread waited or forked from C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

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
