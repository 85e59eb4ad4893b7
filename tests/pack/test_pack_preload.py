"""`--runner preload`: jobs forked from a zygote that imported torch once (memgov/pack/preload.py).

Real processes throughout: a real zygote importing real torch, real launchers, real signals. The
runner-level tests drive :class:`PreloadRunner` the way pack's jobs.py does (Popen of what
``launch`` returns, in a new session); the pack-level ones run ``memgov pack`` itself.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from memgov.pack.preload import PreloadRunner

from ._util import MNIST, TINY, held, mnist_args, pack_running, report, run_pack

PROBE = """\
import json, os, sys, time
import torch  # never `import memgov`: auto-enable alone must govern this job

def private_kib():
    total = 0
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith(("Private_Clean:", "Private_Dirty:")):
                total += int(line.split()[1])
    return total

torch.ones(8).sum()
auto = sys.modules.get("memgov._autoenable")
budget = sys.modules["memgov._cpu.threads"].current() if auto else None
claims = []
for folder, _dirs, files in os.walk(os.environ.get("MEMGOV_DIR", "/nonexistent")):
    if os.path.basename(folder) == "claims":
        claims += [json.load(open(os.path.join(folder, f))) for f in files]
print(json.dumps({"pid": os.getpid(), "private_kib": private_kib(),
                  "mode": auto.outcome.get("mode") if auto else None,
                  "claim_pids": [c.get("pid") for c in claims],
                  "threads": torch.get_num_threads(), "budget": budget and budget.threads,
                  "argv": sys.argv, "cpus": sorted(os.sched_getaffinity(0))}), flush=True)
time.sleep(float(sys.argv[1]))
"""
REFUSED = """\
import json, sys
try:
    import torch  # the claim happens here, and its refusal (MEMGOV_STRICT=1) is raised here
except Exception as exc:
    print(json.dumps({"error": type(exc).__name__, "message": str(exc)}), flush=True)
    sys.exit(5)
print(json.dumps({"error": None}), flush=True)
"""


@pytest.fixture
def short_tmp(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A short TMPDIR (the zygote's socket path must fit 107 bytes), whose path also names every
    process of the preload runner (zygote, launchers, forked jobs): the stray check finds them."""
    folder = Path(tempfile.mkdtemp(prefix="mgz", dir="/tmp"))
    monkeypatch.setenv("TMPDIR", str(folder))
    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR in this process too
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _ours(folder: Path) -> list[int]:
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmdline = proc.info.get("cmdline") or []
        if proc.info.get("status") != psutil.STATUS_ZOMBIE and any(
            str(folder) in a for a in cmdline
        ):
            found.append(proc.pid)
    return found


def _gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


class Jobs:
    """Start jobs through a runner as pack's jobs.py does."""

    def __init__(self, runner: PreloadRunner, cwd: Path, env: dict[str, str]) -> None:
        self.runner, self.cwd, self.env = runner, cwd, env
        self.procs: list[subprocess.Popen[str]] = []

    def start(
        self,
        label: str,
        seconds: float,
        script: str = "probe.py",
        env: dict[str, str] | None = None,
        cpus: set[int] | None = None,
    ) -> tuple[subprocess.Popen[str], dict[str, Any]]:
        argv, full, _ = self.runner.launch(
            [sys.executable, script, str(seconds)],
            env or self.env,
            self.cwd,
            label,
            dict(os.environ),
        )
        # As jobs.py does for --pin: the launcher's affinity, which the forked job takes over.
        pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
        proc = subprocess.Popen(
            argv,
            cwd=self.cwd,
            env=full,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            preexec_fn=pin,
        )
        self.procs.append(proc)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, proc.stderr.read() if proc.stderr else ""
        return proc, json.loads(line)

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()


@pytest.fixture
def jobs(tmp_path: Path, short_tmp: Path) -> Iterator[Jobs]:
    (tmp_path / "probe.py").write_text(PROBE)
    (tmp_path / "refused.py").write_text(REFUSED)
    ledger = tmp_path / "ledger"
    env = {
        "MEMGOV_DIR": str(ledger),
        "MEMGOV_DEVICES": "sim0:16GiB",
        "MEMGOV_CLAIM": "1GiB",
        "MEMGOV_STRICT": "1",
        "PYTHONUNBUFFERED": "1",
    }
    runner = PreloadRunner("torch")
    started = Jobs(runner, tmp_path, env)
    try:
        yield started
    finally:
        started.close()
        runner.cleanup()
        assert _ours(short_tmp) == [], "processes of the preload runner left after cleanup()"
        assert not any(short_tmp.glob("memgov-preload-*")), "zygote folder left behind"


# preexec_fn (the pin, as jobs.py does) makes Popen fork this process, which may have imported
# JAX in an earlier test: JAX warns about that fork (the launcher execs at once).
@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")
def test_forked_job_shares_the_import_and_claims_like_a_spawned_one(jobs: Jobs) -> None:
    proc, forked = jobs.start("job-00", 600, cpus={0})  # held until close() kills it
    spawned_run = subprocess.run(
        [sys.executable, "probe.py", "0"],
        cwd=jobs.cwd,
        env={**os.environ, **jobs.env},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    spawned = json.loads(spawned_run.stdout)
    # The child is the job: its own PID (not the launcher's), its argv, governed by MEMGOV_CLAIM
    # with a claim record on the ledger under its PID, exactly as the spawned job.
    assert forked["pid"] != proc.pid
    assert forked["argv"] == ["probe.py", "600"]
    assert forked["cpus"] == [0]  # --pin: the launcher's affinity
    assert forked["mode"] == spawned["mode"] == "claim"
    assert forked["pid"] in forked["claim_pids"]
    assert spawned["pid"] in spawned["claim_pids"]
    # Each has its CPU share applied to torch (the shares differ: the second saw the first).
    assert forked["threads"] == forked["budget"] and spawned["threads"] == spawned["budget"]
    # Copy-on-write: torch's imported pages stay the zygote's; the spawned job has its own.
    assert forked["private_kib"] < spawned["private_kib"] / 2, (forked, spawned)
    assert spawned["private_kib"] - forked["private_kib"] > 64 * 1024, (forked, spawned)
    # pack measures the launcher and the forked job (NVML, USS).
    assert jobs.runner.host_pids(proc.pid) == [proc.pid, forked["pid"]]
    # A forked job that ends releases its claim at exit (the interpreter's exit handlers ran).
    short, ended = jobs.start("job-01", 0)
    assert short.wait(30) == 0
    left = [
        json.loads(p.read_text()).get("pid")
        for p in Path(jobs.env["MEMGOV_DIR"]).rglob("claims/*.json")
    ]
    assert ended["pid"] in ended["claim_pids"] and ended["pid"] not in left
    assert forked["pid"] in left


def test_a_refused_claim_is_raised_from_the_jobs_import_as_when_spawned(jobs: Jobs) -> None:
    small = {**jobs.env, "MEMGOV_DEVICES": "sim0:1536MiB"}  # one 1 GiB claim fits, not two
    _holder, held = jobs.start("job-00", 600, env=small)  # held until close() kills it
    assert held["mode"] == "claim"
    proc, forked = jobs.start("job-01", 0, script="refused.py", env=small)
    spawned = subprocess.run(
        [sys.executable, "refused.py"],
        cwd=jobs.cwd,
        env={**os.environ, **small},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.wait(10) == spawned.returncode == 5
    assert forked["error"] == json.loads(spawned.stdout)["error"] == "BudgetExceeded", (
        forked,
        spawned.stdout,
    )


def test_signals_reach_the_job_and_a_killed_launcher_takes_its_job(jobs: Jobs) -> None:
    term, term_info = jobs.start("job-00", 60)
    killed, killed_info = jobs.start("job-01", 60)
    # pack's stop: SIGTERM to the launcher's group, forwarded; the launcher dies of it too.
    jobs.runner.stop(term.pid, None, signal.SIGTERM)
    assert term.wait(10) == -signal.SIGTERM
    assert jobs.runner.decode_exit(term.returncode) == (None, signal.SIGTERM)
    assert _gone(term_info["pid"])
    # A launcher SIGKILLed on its own (no forwarding): the zygote kills its job.
    os.kill(killed.pid, signal.SIGKILL)
    assert killed.wait(10) == -signal.SIGKILL
    assert _gone(killed_info["pid"]), "the job of a SIGKILLed launcher still runs"


def test_a_launcher_gone_before_its_fork_leaves_no_job(jobs: Jobs) -> None:
    # A launcher killed before it learns its job's PID (pack's --timeout while the zygote still
    # imports torch): the zygote forks for the request it finds, then kills that child, also
    # before the child has left the zygote's process group (a hang of pack, seen under load).
    import socket
    import struct

    argv, _env, _ = jobs.runner.launch(
        [sys.executable, "probe.py", "60"], jobs.env, jobs.cwd, "job-00", dict(os.environ)
    )
    zygote = jobs.runner._zygote
    assert zygote is not None
    read_end, write_end = os.pipe()
    request = json.dumps(
        {
            "argv": [sys.executable, "probe.py", "60"],
            "env": {**os.environ, **jobs.env},
            "cwd": str(jobs.cwd),
            "cpus": [],
            "umask": 0o022,
        }
    ).encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:  # as _launch.py, then gone
        conn.connect(argv[4])
        socket.send_fds(
            conn, [struct.pack("!I", len(request)) + request], [write_end, write_end, write_end]
        )
    os.close(write_end)
    # Every writer of the pipe gone (EOF) = the forked job is dead (it would sleep 60 s).
    import select

    deadline = time.monotonic() + 20
    with os.fdopen(read_end, "rb", buffering=0) as pipe:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([pipe], [], [], 0.5)
            if ready and not pipe.read(65536):
                break
        else:
            pytest.fail("the job forked for a launcher that was gone still runs")
    deadline = time.monotonic() + 10
    while psutil.Process(zygote.pid).children() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert psutil.Process(zygote.pid).children() == []


def test_a_dead_zygote_fails_its_jobs_with_a_reason(jobs: Jobs) -> None:
    proc, info = jobs.start("job-00", 60)
    zygote = jobs.runner._zygote
    assert zygote is not None
    os.kill(zygote.pid, signal.SIGKILL)
    assert proc.wait(10) == 70
    assert proc.stderr is not None
    said = proc.stderr.read()
    assert "the zygote ended while the job ran" in said, said
    assert _gone(info["pid"]), "the job outlived its zygote"
    # A job started after that fails at once, saying why.
    argv, env, _ = jobs.runner.launch(
        [sys.executable, "probe.py", "0"], jobs.env, jobs.cwd, "job-01", dict(os.environ)
    )
    late = subprocess.run(argv, cwd=jobs.cwd, env=env, capture_output=True, text=True, timeout=30)
    assert late.returncode == 70 and "no zygote answers" in late.stderr, late.stderr
    jobs.runner.cleanup()
    summary = jobs.runner.summary()
    assert summary is not None and summary["zygote_ended"] == "killed by signal 9"


def test_the_zygote_ends_with_pack_and_takes_its_jobs(jobs: Jobs) -> None:
    # pack SIGKILLed: the zygote's stdin (pack's pipe) closes; it ends and kills what it forked.
    proc, info = jobs.start("job-00", 60)
    zygote = jobs.runner._zygote
    assert zygote is not None and zygote.stdin is not None
    zygote.stdin.close()
    assert zygote.wait(10) == 0
    assert proc.wait(10) == 70
    assert proc.stderr is not None
    said = proc.stderr.read()
    assert "pack ended (the zygote's stdin closed) while the job ran" in said, said
    assert _gone(info["pid"]), "a job outlived the zygote that pack's death ended"


def test_other_commands_are_spawned_with_a_note(tmp_path: Path) -> None:
    runner = PreloadRunner("torch")
    for argv in (
        ["sh", "-c", "true"],
        [sys.executable, "-u", "train.py"],
        [sys.executable, "missing.py"],
    ):
        wrapped, _env, _ = runner.launch(argv, {}, tmp_path, "job-00", {})
        assert wrapped == argv
    runner.cleanup()
    summary = runner.summary()
    assert summary is not None and len(summary["notes"]) == 3
    assert "zygote_forked" not in summary  # no zygote was started for them


def _fields(run: dict[str, Any]) -> set[str]:
    return set(run["jobs"][0]) | {f"run.{k}" for k in run if k != "runner_details"}


def test_pack_with_preload_reports_like_the_process_runner(tmp_path: Path, short_tmp: Path) -> None:
    common = ["--device", "cpu", "--no-solo", "--epochs", "1", "--no-progress", str(MNIST)]
    trainer = [*TINY, *held(tmp_path / "hold")]
    done = run_pack(
        "--n", "3", "--runner", "preload", "--out", str(tmp_path / "p"), *common, *trainer
    )
    assert done.returncode == 0, done.stderr
    assert _ours(short_tmp) == [], "zygote, launcher or job left running after pack"
    plain = run_pack("--n", "1", "--out", str(tmp_path / "s"), *common, *TINY)
    assert plain.returncode == 0, plain.stderr
    assert report(tmp_path / "p")["runner"] == "preload"
    forked, spawned = report(tmp_path / "p")["runs"][0], report(tmp_path / "s")["runs"][0]
    assert _fields(forked) == _fields(spawned)
    assert [j["status"] for j in forked["jobs"]] == ["ok"] * 3
    for job in forked["jobs"]:
        # The reported PID is the forked child's, and pack measured it beside its launcher.
        assert job["pid"] != job["host_pid"]
        assert job["pid"] in job["measured_host_pids"]
        assert job["claim_mib"] == spawned["jobs"][0]["claim_mib"]
    assert forked["runner_details"]["zygote_forked"] == 3
    assert forked["runner_details"]["zygote_threads_through_fork"] == 1


def test_pack_timeout_stops_forked_jobs_like_spawned_ones(tmp_path: Path, short_tmp: Path) -> None:
    done = run_pack(
        *mnist_args(
            tmp_path / "p", "--runner", "preload", "--no-solo", "--timeout", "4", epochs=1000
        )
    )
    assert done.returncode == 1, done.stderr
    assert _ours(short_tmp) == []
    for job in report(tmp_path / "p")["runs"][0]["jobs"]:
        assert (job["status"], job["reason"], job["signal"]) == ("failed", "timeout", 15), job


def test_ctrl_c_at_pack_stops_forked_jobs_and_the_zygote(tmp_path: Path, short_tmp: Path) -> None:
    out = tmp_path / "p"
    with pack_running(*mnist_args(out, "--runner", "preload", "--no-solo", epochs=1000)) as pack:
        deadline = time.monotonic() + 120
        while len(list(short_tmp.glob("memgov-preload-*/pids/job-0?"))) < 2:
            assert pack.poll() is None and time.monotonic() < deadline, "jobs never forked"
            time.sleep(0.1)
        pack.send_signal(signal.SIGINT)
        _out, err = pack.communicate(timeout=60)
    assert pack.returncode == 130, err
    assert _ours(short_tmp) == [], "zygote, launcher or job left running after Ctrl-C"
    assert not any(short_tmp.glob("memgov-preload-*"))
    for job in report(out)["runs"][0]["jobs"]:
        assert (job["reason"], job["signal"]) == ("interrupted", 15), job
