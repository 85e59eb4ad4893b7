"""First runs under ``auto`` that must not be sized into an OOM, and OOM growth that stops
(docs/profiles.md), with real processes on a simulated GPU.

The jobs are tests/profiles/job.py ``--capped``: their memory is taken 16 MiB at a time under the
claim, as torch's capped allocator takes it, so a claim below the job's need ends the job with its
own out-of-memory error. 25 copies claim at once (each waits for a start file, then claims).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import memgov.queue as q
from memgov._profiles import store as _profiles
from tests.helpers.queuejobs import write_queue
from tests.profiles.test_profiles import _live_peak, holding

JOB = Path(__file__).with_name("job.py")
MiB, GiB = 2**20, 2**30
NEED_MIB = 1100
"""Above the first-run floor (1 GiB), which copies on a 6 GiB device reach by the fourth."""


COMMAND = (sys.executable, str(JOB), str(NEED_MIB), "--capped", "--hold", "1")


def start_together(env: dict[str, str], tmp_path: Path, jobs: list[str]) -> list[dict[str, Any]]:
    """Start one job.py per name in ``jobs`` (its --job), all claiming at once; wait for all."""
    env = {**env, "MEMGOV_DEVICES": "sim0:6GiB"}
    go = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [*COMMAND, "--job", job, "--start-at", str(go), "--wait", "300"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for job in jobs
    ]
    try:
        go.touch()
        ends = []
        for proc in procs:
            out, err = proc.communicate(timeout=600)
            events = {e["event"]: e for e in map(json.loads, out.splitlines())}
            ends.append({"rc": proc.returncode, "err": err, **events})
        return ends
    finally:
        for proc in procs:
            proc.kill()


def test_25_copies_of_one_job_started_at_once_all_finish(env, tmp_path) -> None:
    ends = start_together(env, tmp_path, ["copies"] * 25)
    failed = [e["err"][-1500:] for e in ends if e["rc"] != 0]
    assert failed == [], failed
    sized = sorted(e["claimed"]["sized"] for e in ends)
    assert sized == ["first-run"] + ["profile"] * 24
    # Every copy after the first was sized from a measured peak: the copies that claimed while
    # the first ran waited for it (one that started later, the machine being busy, found it).
    profiled = [e for e in ends if e["claimed"]["sized"] == "profile"]
    waited = [e for e in profiled if "waited" in e["claimed"]["line"]]
    assert waited and all("for the first run of copies" in e["err"] for e in waited)
    peak = max(r["peak"] for r in _profiles_of(env, "copies") if r["sized"] == "first-run")
    assert min(e["claimed"]["bytes"] for e in profiled) >= _profiles.margin(peak)
    assert min(e["claimed"]["bytes"] for e in ends) >= NEED_MIB * MiB


def test_25_first_runs_of_mixed_jobs_all_finish(env, tmp_path) -> None:
    jobs = ["mix-a"] * 9 + ["mix-b"] * 8 + ["mix-c"] * 8
    ends = start_together(env, tmp_path, jobs)
    failed = [e["err"][-1500:] for e in ends if e["rc"] != 0]
    assert failed == [], failed
    for job in ("mix-a", "mix-b", "mix-c"):
        mine = [e["claimed"] for e in ends if e["claimed"]["job"] == job]
        assert sorted(c["sized"] for c in mine) == ["first-run"] + ["profile"] * (len(mine) - 1)
        assert min(c["bytes"] for c in mine) >= NEED_MIB * MiB


def _profiles_of(env: dict[str, str], job: str) -> list[dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-m", "memgov", "profiles", "show", job, "--json"],
        env={**env, "MEMGOV_DEVICES": "sim0:6GiB"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    history: list[dict[str, Any]] = json.loads(done.stdout)["history"]
    return history


def test_a_job_that_runs_out_whatever_it_gets_stops_growing(env) -> None:
    claims, lines = [], []
    for _ in range(4):
        done = subprocess.run(
            [sys.executable, str(JOB), "10", "--job", "leaky", "--end", "oom"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 1 and "MemoryError" in done.stderr
        claimed = json.loads(done.stdout.splitlines()[0])
        claims.append(claimed["bytes"])
        lines.append(claimed["line"])
    # 4 GiB (a first run on the 16 GiB device), then 1.5 x twice, then no more.
    assert claims == [4 * GiB, 6 * GiB, 9 * GiB, 9 * GiB]
    assert (
        "grown after each run that ran out of memory: 4.00 GiB -> 6.00 GiB -> 9.00 GiB"
        in (lines[3])
    )
    assert "not grown further: 1 more run ran out at that size too" in lines[3]
    assert "grows at most 2 times in a row (2.25 x the first that ran out)" in lines[3]
    assert "not grown further" not in lines[2]


def test_an_oom_on_a_simulated_gpu_is_never_counted_as_a_neighbours(tmp_path, monkeypatch) -> None:
    # The queue re-runs the auto job twice, larger; each run's peak is the host memory it used
    # (far below its claim): that is the job's own OOM, a simulated GPU has no neighbour's.
    monkeypatch.setenv("MEMGOV_DEVICES", "sim0:16GiB")
    command = [sys.executable, str(JOB), "10", "--end", "oom", "--size", "from-env"]
    jobs = [{"name": "leaky", "cmd": command, "claim": "auto"}]
    report = q.run(write_queue(tmp_path / "q.toml", jobs), "fifo").to_json()
    assert (report["ooms"], report["retries"]) == (3, 2)
    peaks = [r["peak_bytes"] for r in report["jobs"]]
    assert all(p is not None and p < 0.95 * 4 * GiB for p in peaks)
    assert report["killed_by_neighbour"] == 0


def test_a_copy_waiting_for_a_first_run_that_is_sigkilled_is_sized_from_its_last_peak(env) -> None:
    first = holding(env, "150", "--job", "killed-first")
    second = None
    try:
        assert first.stdout is not None
        while json.loads(first.stdout.readline())["event"] != "used":
            pass
        second = subprocess.Popen(
            [sys.executable, str(JOB), "10", "--job", "killed-first"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert second.stderr is not None
        assert "for the first run of killed-first" in second.stderr.readline()  # it waits
        live = Path(env["MEMGOV_DIR"]) / "v1" / "_profiles" / str(os.geteuid()) / "live"
        deadline = time.monotonic() + 60
        while _live_peak(live) < 150 * MiB:  # the sampler writes its peak within a second
            assert time.monotonic() < deadline, "the live file never showed the peak"
            time.sleep(0.1)
        first.send_signal(signal.SIGKILL)  # no exit handler: the lock goes with the process
        first.wait(timeout=30)
        out, _ = second.communicate(timeout=120)
    finally:
        first.kill()
        if second is not None:
            second.kill()
    claimed = json.loads(out.splitlines()[0])
    runs = _profiles_of(env, "killed-first")
    assert runs[0]["end"] == "killed" and runs[0]["peak"] >= 150 * MiB
    assert claimed["sized"] == "profile" and claimed["bytes"] == _profiles.margin(runs[0]["peak"])
    assert "waited" in claimed["line"] and f"(pid {first.pid})" in claimed["line"]
