"""The queue's lifecycle with real processes: an attempt starts at most once whatever dies when
(the start handshake), a lost attempt leaves nothing running, a refused request queues nothing,
a wait in the ledger is not run time, and files that are not jobs are problems, not crashes."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import memgov.queue as q
from memgov._gpu.devices import candidates
from memgov._ledger.ledger import DeviceLedger
from memgov.queue.queuefile import job_spec
from memgov.queue.store import Store
from tests.helpers.queuejobs import (
    ROOT,
    cli_proc,
    lines,
    memgov_cli,
    sleeper,
    wait_for,
    write_queue,
)


def state(pid: int) -> str | None:
    """The process's state letter (R, S, T, Z...), None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0]
    except FileNotFoundError:
        return None


def alive(pid: int) -> bool:
    return state(pid) not in (None, "Z")


STOP_FIRST_SHEPHERD = """\
import os, signal, sys
if "memgov.queue.shepherd" in sys.orig_argv:
    try:
        fd = os.open({mark!r}, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        pass
    else:  # the first shepherd only: stopped before any of its code runs, as a loaded host does
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        os.kill(os.getpid(), signal.SIGSTOP)
"""


def test_a_runner_killed_before_its_fresh_shepherd_got_going_never_runs_the_job_twice(
    tmp_path: Path,
) -> None:
    mark = tmp_path / "started"
    stopped = tmp_path / "stopped-shepherd"
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(STOP_FIRST_SHEPHERD.format(mark=str(stopped)))
    env = {"PYTHONPATH": f"{hook}{os.pathsep}{ROOT}"}
    (job,) = q.add([job_spec({"cmd": sleeper(0.1, mark, "once"), "claim": "1GiB"}, "j", tmp_path)])
    first = cli_proc("queue", "run", env=env)
    wait_for(lambda: stopped.exists() and stopped.read_text().isdigit())
    shepherd = int(stopped.read_text())
    wait_for(lambda: state(shepherd) == "T")  # a real SIGSTOP: it has not run a line of its own
    first.kill()  # SIGKILL to the runner while its fresh shepherd is not going yet
    first.wait(30)  # (its stderr stays open: the stopped shepherd inherited it)
    try:
        second = cli_proc("queue", "run", "--json", env=env)
        wait_for(lambda: Store().runners())  # the second runner holds the queue: it has looked
        time.sleep(2)  # time enough for a second runner that misses the attempt to start another
        os.kill(shepherd, signal.SIGCONT)
        out, err = second.communicate(timeout=120)
        wait_for(lambda: not alive(shepherd))
    finally:
        if alive(shepherd):
            os.kill(shepherd, signal.SIGKILL)
            os.kill(shepherd, signal.SIGCONT)
    assert second.returncode == 0, err
    assert lines(mark) == ["once"]  # the command ran exactly once
    stored = Store().get(job.id)
    assert stored.state == "done" and [a.result for a in stored.attempts] == ["ok"]
    assert [j["end"] for j in json.loads(out)["jobs"]] == ["ok"]


def _claiming_job(tmp_path: Path) -> tuple[int, Path]:
    """A queued job whose claimer is a grandchild of its shepherd (a shell runs it, and is not
    replaced by it); the claimer's pid is written to the file returned."""
    pids = tmp_path / "pids"
    code = (
        "import os, time, memgov\n"
        "c = memgov.claim(int(os.environ['MEMGOV_CLAIM']), device=os.environ['MEMGOV_DEVICE'])\n"
        f"open({str(pids)!r}, 'a').write(str(os.getpid()) + chr(10))\n"
        "time.sleep(120)\n"
    )
    # The claimer is a grandchild of the shepherd: a shell runs it (and is not replaced by it).
    cmd = ["sh", "-c", f"{shlex.quote(sys.executable)} -c {shlex.quote(code)}; true"]
    (job,) = q.add([job_spec({"cmd": cmd, "claim": "2GiB"}, "job", tmp_path)])
    return job.id, pids


def _shepherd(pids: Path) -> tuple[int, int]:
    """(the shepherd's pid, the claimer's) once the claimer holds its claim."""
    wait_for(lambda: lines(pids))
    (data,) = [d for _alive, d in Store().live_records().values() if d]
    assert data["phase"] == "started"
    return data["pid"], int(lines(pids)[0])


def test_a_killed_shepherd_leaves_nothing_running_and_no_claim_held(tmp_path: Path) -> None:
    job_id, pids = _claiming_job(tmp_path)
    serve = cli_proc("queue", "serve", "--grace", "1")
    try:
        shepherd, claimer = _shepherd(pids)
        os.kill(shepherd, signal.SIGKILL)  # while its command runs
        wait_for(lambda: Store().get(job_id).state == "failed")
        assert Store().get(job_id).attempts[-1].result == "lost"
        wait_for(lambda: not alive(claimer), timeout=30)  # stopped, not left unreachable
        device = candidates("auto")[0]
        wait_for(lambda: DeviceLedger(device).snapshot().claims == [], timeout=30)
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.communicate(timeout=60)


def test_a_job_whose_runner_and_shepherd_died_is_listed_lost_and_stopped_by_the_next_runner(
    tmp_path: Path,
) -> None:
    job_id, pids = _claiming_job(tmp_path)
    serve = cli_proc("queue", "serve", "--grace", "1")
    shepherd, claimer = _shepherd(pids)
    serve.kill()  # the runner first, then its shepherd: nobody follows the job any more
    serve.wait(30)  # (its stderr stays open: the shepherd inherited it)
    os.kill(shepherd, signal.SIGKILL)
    wait_for(lambda: not alive(shepherd))
    listed = memgov_cli("queue", "--json")
    (row,) = json.loads(listed.stdout)["jobs"]
    assert (row["state"], row["attempts"][-1]["result"]) == ("failed", "lost")  # not "running"
    assert "failed (lost)" in memgov_cli("queue").stdout
    ran = memgov_cli("queue", "run", "--json")  # the next runner adopts it: lost, and stopped
    assert ran.returncode == 1 and [j["end"] for j in json.loads(ran.stdout)["jobs"]] == ["lost"]
    wait_for(lambda: not alive(claimer), timeout=30)
    device = candidates("auto")[0]
    wait_for(lambda: DeviceLedger(device).snapshot().claims == [], timeout=30)
    assert Store().get(job_id).state == "failed"


def test_a_wait_of_the_claim_in_the_ledger_is_not_run_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEMGOV_DEVICES", "sim0:16GiB")
    ready, go = tmp_path / "ready", tmp_path / "go"
    code = (
        "import os, pathlib, time\n"
        f"pathlib.Path({str(ready)!r}).touch()\n"
        f"while not pathlib.Path({str(go)!r}).exists(): time.sleep(0.02)\n"
        "import memgov\n"
        "c = memgov.claim(int(os.environ['MEMGOV_CLAIM']), device=os.environ['MEMGOV_DEVICE'],"
        " wait=300)\n"
        "time.sleep(0.2)\n"
    )
    job = {"name": "w", "cmd": [sys.executable, "-c", code], "claim": "10GiB"}
    path = write_queue(tmp_path / "q.toml", [job])
    runner = cli_proc("queue", "run", str(path), "--json")
    wait_for(ready.exists)  # placed and started: the GPU was free when the runner looked
    # A neighbour outside the queue (another user's runner placing at the same moment) takes
    # the room before the job's claim: the claim waits in the ledger for it.
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, memgov; c = memgov.claim(10 * 2**30, device=0); print('held', "
            "flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    go.touch()
    device = candidates("auto")[0]
    wait_for(lambda: DeviceLedger(device).snapshot().queue)  # the job's claim waits
    time.sleep(3)  # a wait far longer than the interpreter's start before the ready file
    holder.communicate("")  # the neighbour leaves: the job's claim is admitted
    out, err = runner.communicate(timeout=120)
    assert runner.returncode == 0, err
    (row,) = json.loads(out)["jobs"]
    assert row["end"] == "ok"
    (stored,) = q.jobs()[0]
    attempt = stored.attempts[-1]
    # Its run is its time less the wait: as if it had started after the ready file (the wait,
    # 3 s or more, is longer than all it did before). Counted whole, it began before the file.
    assert attempt.start > ready.stat().st_mtime
    assert attempt.end is not None and row["run_s"] == pytest.approx(
        attempt.end - attempt.start, abs=0.01
    )


def test_a_refused_queue_file_or_solo_report_queues_nothing(tmp_path: Path) -> None:
    jobs = [{"cmd": sleeper(0.1, tmp_path / "ran", "x"), "claim": "1GiB"}]
    bad = write_queue(tmp_path / "bad.toml", jobs, policy="nosuch")
    refused = memgov_cli("queue", "run", str(bad))
    assert refused.returncode == 2
    assert "policy 'nosuch': accepted memgov" in refused.stderr
    good = write_queue(tmp_path / "good.toml", jobs)
    no_solo = memgov_cli("queue", "run", str(good), "--solo", str(tmp_path / "none.json"))
    assert no_solo.returncode == 2 and "--solo" in no_solo.stderr
    assert q.jobs() == ([], [])  # refused means nothing is queued
    later = memgov_cli("queue", "run", "--json")
    assert later.returncode == 0 and json.loads(later.stdout)["jobs"] == []
    assert not (tmp_path / "ran").exists()


def test_a_fifo_or_a_folder_named_like_a_job_is_a_problem_not_a_crash(tmp_path: Path) -> None:
    (job,) = q.add([job_spec({"cmd": sleeper(0.1), "claim": "1GiB"}, "job", tmp_path)])
    folder = Store().path / "jobs"
    os.mkfifo(folder / "7.json")
    (folder / "8.json").mkdir()
    listed = memgov_cli("queue", "--json")
    assert listed.returncode == 0, listed.stderr
    problems = json.loads(listed.stdout)["problems"]
    assert len(problems) == 2 and all("not a regular file" in p for p in problems)
    assert "7.json" in problems[0] and "8.json" in problems[1]
    ran = memgov_cli("queue", "run", "--json")  # the good job runs; the others are passed over
    assert ran.returncode == 0, ran.stderr
    assert [j["end"] for j in json.loads(ran.stdout)["jobs"]] == ["ok"]
    assert Store().get(job.id).state == "done"
    assert "removed job file 7" in memgov_cli("queue", "cancel", "7").stdout
