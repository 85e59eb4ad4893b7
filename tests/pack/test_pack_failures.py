"""Jobs that fail, and a pack that is stopped: real signals, real refusals, real namespaces."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

import memgov

from ._util import MNIST, ROOT, mnist_args, pack_cmd, pack_running, report, run_pack

needs_root_unshare = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="PID namespaces need root and util-linux unshare",
)


def _trainers(pack: psutil.Process, count: int, timeout: float = 60) -> list[psutil.Process]:
    """The pack's trainer processes, once ``count`` of them run."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = []
        for proc in pack.children(recursive=True):
            try:
                if any(
                    "train_torch.py" in part for part in proc.cmdline()
                ) and proc.name().startswith("python"):
                    found.append(proc)
            except psutil.Error:
                continue
        if len(found) >= count:
            return found
        time.sleep(0.1)
    raise AssertionError(f"fewer than {count} trainers started within {timeout} s")


def test_refused_budget_is_the_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A 2 GiB simulated GPU with 1.5 GiB held here: no 1 GiB job claim can fit.
    monkeypatch.setenv("MEMGOV_DEVICES", "sim0:2GiB")
    held = memgov.claim("1536MiB", name="holder-in-test")
    out = tmp_path / "out"
    try:
        done = run_pack(*mnist_args(out, "--claim", "1GiB", "--no-solo"))
    finally:
        held.release()
    assert done.returncode == 1, done.stderr
    data = report(out)
    assert (data["ok"], data["failed"], data["reasons"]) == (0, 2, {"budget_refused": 2})
    for job in data["jobs"]:
        assert job["reason"] == "budget_refused" and job["epochs_done"] == 0
        assert "cannot claim 1.00 GiB on sim0" in job["detail"]
        assert "holder-in-test" in job["detail"]  # the refusal names who holds the budget
    assert "budget_refused" in done.stdout


@pytest.mark.parametrize("runner", ["process", pytest.param("namespace", marks=needs_root_unshare)])
def test_a_killed_job_fails_alone_with_its_reason(tmp_path: Path, runner: str) -> None:
    out = tmp_path / "out"
    with pack_running(*mnist_args(out, "--runner", runner, "--no-solo")) as proc:
        # Killed while the trainers start up: the other one still has all its work ahead.
        victim = _trainers(psutil.Process(proc.pid), 2)[-1]
        victim.send_signal(signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 1, stderr
    jobs = report(out)["jobs"]
    bad = [j for j in jobs if j["status"] != "ok"]
    assert len(bad) == 1 and len(jobs) == 2
    assert bad[0]["reason"] == "killed" and bad[0]["signal"] == signal.SIGKILL
    assert "killed by SIGKILL" in bad[0]["detail"]
    good = next(j for j in jobs if j["status"] == "ok")
    # pack (host PID namespace) saw the survivor's claim in the ledger, matched by PID namespace
    # and PID there: the claim was made and held across namespaces.
    assert good["claim_mib"] == 1024 and good["claim_mode"] == "soft"
    if runner == "namespace":
        assert good["pid"] == 2  # inside its namespace: sh is PID 1, the trainer its child
        assert bad[0]["host_pid"] != victim.pid  # the job's root is unshare, the trainer below
    assert "killed" in stdout


@pytest.mark.parametrize("runner", ["process", pytest.param("namespace", marks=needs_root_unshare)])
def test_ctrl_c_stops_every_job_and_leaves_no_process(tmp_path: Path, runner: str) -> None:
    out = tmp_path / "out"
    argv = ("--n", "2", "--device", "cpu", "--runner", runner, "--no-solo", str(MNIST))
    with pack_running(*argv, "--epochs", "50", "--out", str(out), "--", "--limit", "4096") as proc:
        pack = psutil.Process(proc.pid)
        _trainers(pack, 2)
        tree = pack.children(recursive=True)  # unshare and sh too, for the namespace runner
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "interrupted; partial report in" in stderr
    left = [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert left == [], [(p.pid, p.ppid(), p.cmdline(), p.status()) for p in left]
    data = report(out)
    assert data["interrupted"] is True
    assert [j["reason"] for j in data["jobs"]] == ["interrupted", "interrupted"]


CTRL_C_AS_A_JOB_STARTS = """
import os, runpy, signal, subprocess, sys
pids, real = sys.argv[1], subprocess.Popen
started = []


class Started(real):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if "train_torch.py" in " ".join(map(str, args[0] if args else kwargs["args"])):
            started.append(self.pid)
            with open(pids, "a") as out:
                out.write(f"{self.pid}\\n")
            if len(started) == 2:  # Ctrl-C lands as the second job's Popen returns
                os.kill(os.getpid(), signal.SIGINT)


subprocess.Popen = Started
sys.argv = ["memgov", *sys.argv[2:]]
runpy.run_module("memgov", run_name="__main__", alter_sys=True)
"""


def test_ctrl_c_as_a_job_starts_still_stops_that_job(tmp_path: Path) -> None:
    """Ctrl-C inside Popen, after its fork: the job runs, and pack must know it to stop it."""
    pids = tmp_path / "pids"
    argv = pack_cmd("--n", "2", "--device", "cpu", "--no-solo", str(MNIST), "--epochs", "50")
    argv += ["--out", str(tmp_path / "out"), "--", "--limit", "4096"]
    proc = subprocess.run(
        [sys.executable, "-c", CTRL_C_AS_A_JOB_STARTS, str(pids), *argv[3:]],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    started = [int(line) for line in pids.read_text().split()]
    left = []
    for pid in started:
        with contextlib.suppress(psutil.Error):
            job = psutil.Process(pid)
            if job.status() != psutil.STATUS_ZOMBIE:
                left.append(job)
                job.kill()  # an orphan: what the test found, not left on the host
    assert len(started) == 2, proc.stderr
    assert proc.returncode == 130, proc.stderr
    assert left == [], "a job pack started kept running after pack stopped"
    data = report(tmp_path / "out")
    assert [j["reason"] for j in data["jobs"]] == ["interrupted", "interrupted"]


def test_timeout_stops_the_jobs_with_that_reason(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = run_pack(
        *mnist_args(out, "--timeout", "2", n=1, epochs=50, trainer=["--", "--limit", "4096"])
    )
    assert done.returncode == 1, done.stderr
    job = report(out)["jobs"][0]
    assert job["reason"] == "timeout" and "--timeout" in job["detail"]
