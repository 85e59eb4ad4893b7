"""Interrupt storm: random exceptions injected throughout claim() and
release() in many threads of several processes, for a fixed time. Afterwards: no leaked lock or
record, no foreign descriptor closed or replaced, and no over-commit seen at any moment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.procs import Monitor, ledger

WORKER = Path(__file__).resolve().parent / "storm_worker.py"
PROCESSES = 4
SECONDS = 15


@pytest.fixture
def device(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("MEMGOV_DEVICES", "sim0:8GiB")
    return "sim0"


def test_interrupt_storm_leaves_nothing_behind(device: str) -> None:
    monitor = Monitor(device, period=0.005)
    monitor.start()
    env = dict(os.environ)
    env.pop("MEMGOV_HOLDER", None)
    # The CPU-share record is held for a governed process's whole life by design (not released
    # with a claim); the storm counts locks left after claim/release, so it runs without it.
    env["MEMGOV_THREADS"] = "off"
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(SECONDS), str(seed)],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for seed in range(1, PROCESSES + 1)
    ]
    reports = []
    try:
        for proc in procs:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line, proc.stderr.read() if proc.stderr else ""
            reports.append(json.loads(line))
        # Every worker is alive and holds nothing: the ledger must show no live record at all.
        snap = ledger(device).snapshot()
        assert snap.claims == [] and snap.queue == [] and snap.unknown == [], snap
    finally:
        monitor.stop()
        for proc in procs:
            out, err = proc.communicate("\n", timeout=60)
            assert proc.returncode == 0, err
            assert '"after": "ok"' in out
    injected = sum(r["injected_trace"] + r["injected_async"] for r in reports)
    print(
        json.dumps(
            {
                "reports": reports,
                "monitor_samples": monitor.samples,
                "max_claimed": monitor.max_claimed,
            }
        )
    )
    assert monitor.violations == []
    assert all(r["foreign"] == [] for r in reports), reports
    assert all(r["my_locks"] == 0 and r["open_ledger_files"] == 0 for r in reports), reports
    assert all(not r["held"] and r["alive_threads"] == 0 for r in reports), reports
    assert all(r.get("unexpected", 0) == 0 for r in reports), reports
    # Over 1,000 interrupts landed inside memgov's code, and claims still went through between
    # them. How many claims fit in SECONDS is the machine's speed (0-75 of them on 2 cores under a
    # load of 20 summed over the workers, over 100 on an idle one), not memgov's behaviour.
    assert injected > 1000 and sum(r["claims"] for r in reports) > 0, reports


def test_no_descriptor_outlives_an_interrupted_claim(device: str) -> None:
    # Ctrl-C at random moments of many claim/release cycles: the process's descriptors (all of
    # them, /proc/self/fd) are as many afterwards as before (the code before left 75 and 10:
    # results/cpu-2core/2026-11-24-interrupted-claims.txt), and every interrupt reached the
    # program.
    worker = Path(__file__).resolve().parent / "interrupted_claims.py"
    for seed, most in ((1, 0.004), (2, 0.03)):
        done = subprocess.run(
            [sys.executable, str(worker), "3000", str(seed), str(most)],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        got = json.loads(done.stdout.strip().splitlines()[-1])
        # Enough interrupts landed to mean something; how many of the 3,000 land inside a claim
        # is the machine's speed against the random delays (295 in a fresh clone's run as root,
        # below the 300 this asked before): not memgov's behaviour, which the line below checks.
        assert got["interrupted"] > 100, got
        assert got["after"] == got["before"] and got["ledger_files"] == 0, got
        assert got["share_record_held"] is True, got  # the process's CPU-share record alive
        # No interrupt was swallowed: one landing in a Python weakref callback of memgov's is
        # printed as "Exception ignored" and dropped (23 and 11 times in these two runs, when
        # the callbacks that clear a closed file's entry and a claim's mark were Python code).
        assert "Exception ignored" not in done.stderr, done.stderr[-2000:]


def test_a_kept_interrupt_keeps_nothing_of_the_ledger_open(device: str) -> None:
    """SIGALRM's handler raising at random moments of claim() and release(), each interrupt kept
    as an interactive session keeps the last (its traceback keeps the interrupted frames alive):
    once the claim is released, the process holds nothing of the ledger but its own CPU-share
    record. Before, a kept interrupt held what its frames had open: a replaced CPU-share
    record's old file, the admission lock (every claim on the device waited for it), an
    admitted record (its budget stayed claimed)."""
    worker = Path(__file__).resolve().parent / "interrupted_claims.py"
    env = {**os.environ, "MEMGOV_THREADS": "once"}  # no follower thread at work in the ledger
    done = subprocess.run(
        [sys.executable, str(worker), "1500", "3", "0.01", "keep"],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["interrupted"] > 100, got
    assert got["kept"] == [], got["kept"][:20]
    assert got["after"] == got["before"] and got["ledger_files"] == 0, got
