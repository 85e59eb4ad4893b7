"""The runner's promises with real processes: a runner killed with SIGKILL and started again
loses no job and runs none twice; Ctrl-C stops cleanly; cancel; OOMs under learned sizes are
re-tried larger; the CLI's add, list and log."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import memgov.queue as q
from memgov._profiles import store as _profiles
from memgov.queue.model import Attempt
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


def test_a_runner_killed_mid_queue_and_restarted_loses_no_job_and_runs_none_twice(
    tmp_path: Path,
) -> None:
    mark = tmp_path / "started"
    jobs = [
        {"name": f"j{i}", "cmd": sleeper(0.6, mark, f"j{i}"), "claim": "4GiB"} for i in range(6)
    ]
    path = write_queue(tmp_path / "q.toml", jobs, policy="fifo-exclusive")
    one_gpu = {"MEMGOV_DEVICES": "sim0:16GiB"}
    first = cli_proc("queue", "run", str(path), env=one_gpu)
    wait_for(lambda: len(lines(mark)) >= 3)
    first.kill()  # SIGKILL: no handler runs; a job is running under its shepherd
    first.wait(30)
    again = cli_proc("queue", "run", str(path), "--json", env=one_gpu)
    out, err = again.communicate(timeout=120)
    assert again.returncode == 0, err
    report = json.loads(out)
    assert sorted(lines(mark)) == [f"j{i}" for i in range(6)]  # each ran exactly once
    assert sorted(j["name"] for j in report["jobs"]) == [f"j{i}" for i in range(6)]
    assert all(j["end"] == "ok" and j["attempts"] == 1 for j in report["jobs"])
    found, problems = q.jobs(Store())
    assert problems == [] and {j.state for j in found} == {"done"}
    assert "added again" not in err


def _running_job(tmp_path: Path, mark: Path, live: str) -> int:
    spec = job_spec({"cmd": sleeper(0.1, mark, "once"), "claim": "1GiB"}, "job", tmp_path)
    (job,) = q.add([spec])

    def begin(stored: q.Job) -> None:
        stored.state = "running"
        stored.attempts.append(Attempt(1, 2**30, 0, "sim0", live, start=time.time()))

    Store().update(job.id, begin)
    return job.id


def test_a_job_whose_shepherd_never_started_it_is_queued_again_and_runs_once(
    tmp_path: Path,
) -> None:
    mark = tmp_path / "started"
    job_id = _running_job(tmp_path, mark, "00000000000000000001-aaaaaaaaaaaa.json")
    report = q.run(None, "fifo").to_json()  # no live record: it provably never started
    assert lines(mark) == ["once"]
    job = Store().get(job_id)
    assert job.state == "done"
    assert [a.result for a in job.attempts] == ["not_started", "ok"]
    assert [j["end"] for j in report["jobs"]] == ["ok"]


def test_a_job_whose_shepherd_died_while_it_ran_is_lost_not_run_again(tmp_path: Path) -> None:
    mark = tmp_path / "started"
    live = "00000000000000000002-bbbbbbbbbbbb.json"
    job_id = _running_job(tmp_path, mark, live)
    # A shepherd that reached "started" and died (its lock dropped with it): the command may
    # have finished, so the job must not run again.
    code = (
        "from memgov.queue.store import Store; from memgov.queue.shepherd import live_payload\n"
        f"o = {{'id': {job_id}, 'attempt': 1, 'device': 'sim0', 'bytes': 1, 'name': 'x'}}\n"
        f"Store().start_live({live!r}, live_payload(o, 'started', child=999999))\n"
    )
    subprocess.run(
        [sys.executable, "-c", code], check=True, env={**os.environ, "PYTHONPATH": str(ROOT)}
    )
    report = q.run(None, "fifo").to_json()
    assert lines(mark) == []
    job = Store().get(job_id)
    assert job.state == "failed" and job.attempts[-1].result == "lost"
    assert report["jobs"][0]["end"] == "lost"


def _pids(path: Path) -> list[int]:
    return [int(x) for x in lines(path)]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[-1].split()[0] != "Z"


def test_ctrl_c_stops_every_job_saves_the_state_and_frees_the_queue(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    record = f"import os; open({str(pids)!r}, 'a').write(str(os.getpid()) + chr(10))"
    polite = ["python3", "-c", f"{record}; import time; time.sleep(60)"]
    stubborn = [
        "python3",
        "-c",
        f"import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); {record}; "
        "import time; time.sleep(60)",
    ]
    for cmd in (polite, stubborn):
        assert memgov_cli("queue", "add", "--claim", "1GiB", "--", *cmd).returncode == 0
    serve = cli_proc("queue", "serve", "--grace", "1", "--json")
    wait_for(lambda: len(_pids(pids)) == 2)
    second = memgov_cli("queue", "run")  # one runner per user: it would run the jobs twice
    assert second.returncode == 2 and "already runs your queue (pid" in second.stderr
    serve.send_signal(signal.SIGINT)
    out, err = serve.communicate(timeout=60)
    assert serve.returncode == 130, err
    assert json.loads(out.splitlines()[-1])["interrupted"] == signal.SIGINT  # the report: last line
    wait_for(lambda: not any(_alive(p) for p in _pids(pids)), timeout=10)
    found, _ = q.jobs()
    assert [j.state for j in found] == ["queued", "queued"]  # saved, to run again
    assert [j.attempts[-1].result for j in found] == ["stopped", "stopped"]
    assert Store().runners() == []  # the runner's record is released: a new one may start


def test_cancel_a_queued_and_a_running_job(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    record = f"import os; open({str(pids)!r}, 'a').write(str(os.getpid()) + chr(10))"
    long = ["python3", "-c", f"{record}; import time; time.sleep(60)"]
    add = memgov_cli("queue", "add", "--json", "--claim", "1GiB", "--", *long)
    job_id = json.loads(add.stdout)["id"]
    serve = cli_proc("queue", "serve", "--grace", "1")
    try:
        wait_for(lambda: len(_pids(pids)) == 1)
        done = memgov_cli("queue", "cancel", str(job_id))
        assert done.returncode == 0 and "stopping job" in done.stdout
        wait_for(lambda: Store().get(job_id).state == "cancelled", timeout=30)
        assert not _alive(_pids(pids)[0])
        queued = memgov_cli(
            "queue",
            "add",
            "--json",
            "--gpu",
            "1",
            "--claim",
            "20%",
            "--",
            "python3",
            "-c",
            "import time; time.sleep(60)",
        )
        second = json.loads(queued.stdout)["id"]
        quick = memgov_cli("queue", "add", "--json", "--claim", "1GiB", "--", "true")
        third = json.loads(quick.stdout)["id"]  # added while serve runs: serve runs it
        wait_for(lambda: Store().get(third).state == "done", timeout=60)
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.communicate(timeout=60)
    assert Store().get(second).state == "queued"
    assert "cancelled job" in memgov_cli("queue", "cancel", str(second)).stdout
    assert Store().get(second).state == "cancelled"
    again = memgov_cli("queue", "cancel", str(second))
    assert again.returncode == 2 and "cancelled already" in again.stderr


def _oom_once(counter: Path, times: int) -> list[str]:
    code = (
        "import pathlib, sys\n"
        f"p = pathlib.Path({str(counter)!r})\n"
        "n = int(p.read_text()) if p.exists() else 0\n"
        "p.write_text(str(n + 1))\n"
        f"if n < {times}:\n"
        "    print('torch.OutOfMemoryError: CUDA out of memory.', file=sys.stderr)\n"
        "    sys.exit(1)\n"
    )
    return ["python3", "-c", code]


def test_an_oom_under_a_learned_size_is_retried_larger_at_most_twice(tmp_path: Path) -> None:
    jobs = [
        {"name": "once", "cmd": _oom_once(tmp_path / "a", 1), "claim": "auto"},
        {"name": "always", "cmd": _oom_once(tmp_path / "b", 99), "claim": "auto"},
        {"name": "given", "cmd": _oom_once(tmp_path / "c", 99), "claim": "2GiB"},
    ]
    report = q.run(write_queue(tmp_path / "q.toml", jobs), "fifo").to_json()
    rows = {j["name"]: j for j in report["jobs"]}
    assert (rows["once"]["end"], rows["once"]["ooms"], rows["once"]["retries"]) == ("ok", 1, 1)
    assert (rows["always"]["end"], rows["always"]["ooms"], rows["always"]["retries"]) == (
        "oom",
        3,
        2,
    )
    assert (rows["given"]["end"], rows["given"]["ooms"], rows["given"]["retries"]) == (
        "oom",
        1,
        0,
    )  # a size the user gave is not changed
    assert report["ooms"] == 5 and report["retries"] == 3
    claims = [a.claim_bytes for a in Store().get(rows["always"]["id"]).attempts]
    assert claims[1] >= 1.5 * claims[0] and claims[2] >= 1.5 * claims[1]


def test_a_retry_claims_at_least_the_peak_a_siblings_run_taught_meanwhile(tmp_path: Path) -> None:
    # The first attempt records, as a sibling of the same job finishing would, a run with a peak
    # far above its own claim x OOM_GROWTH, then runs out of memory: the re-try claims what the
    # profile says the job needs, not only 1.5 x the size that was too small.
    counter = tmp_path / "n"
    code = (
        "import os, pathlib, sys, time\n"
        "from memgov._profiles import store as _profiles\n"
        f"p = pathlib.Path({str(counter)!r})\n"
        "n = int(p.read_text()) if p.exists() else 0\n"
        "p.write_text(str(n + 1))\n"
        "if n == 0:\n"
        "    run = {'peak': 12 * 2**30, 'end': 'exit', 'time': time.time(), 'claim': 14 * 2**30,"
        " 'pid': 1, 'simulated': True}\n"
        "    _profiles.record(os.environ['MEMGOV_JOB'], 'sibling', [run])\n"
        "    print('torch.OutOfMemoryError: CUDA out of memory.', file=sys.stderr)\n"
        "    sys.exit(1)\n"
    )
    jobs = [{"name": "big", "cmd": [sys.executable, "-c", code], "claim": "auto"}]
    report = q.run(write_queue(tmp_path / "q.toml", jobs), "fifo").to_json()
    (row,) = report["jobs"]
    assert (row["end"], row["ooms"], row["retries"]) == ("ok", 1, 1)
    first, second = (a.claim_bytes for a in Store().get(row["id"]).attempts)
    assert first * 1.5 < 12 * 2**30  # the first-run size, grown, would not reach the peak
    assert second >= _profiles.margin(12 * 2**30)  # the peak + 10 % + 64 MiB


def test_a_command_line_that_names_an_oom_is_not_an_oom(tmp_path: Path) -> None:
    # the log's banner names the command; only the command's own output can say it ran out
    code = "import sys  # handles torch.OutOfMemoryError elsewhere\nsys.exit(3)"
    jobs = [{"name": "x", "cmd": ["python3", "-c", code], "claim": "auto"}]
    report = q.run(write_queue(tmp_path / "q.toml", jobs), "fifo").to_json()
    (row,) = report["jobs"]
    assert (row["end"], row["ooms"], row["retries"]) == ("failed", 0, 0)


def test_the_report_names_jobs_held_back_although_a_gpu_had_room(tmp_path: Path) -> None:
    # one job per GPU (fifo-exclusive), both pinned to GPU 0: the second waits with room free
    quick = ["python3", "-c", "import time; time.sleep(1)"]
    jobs = [{"name": n, "cmd": quick, "claim": "1GiB", "gpu": 0} for n in ("a", "b")]
    report = q.run(write_queue(tmp_path / "q.toml", jobs), "fifo-exclusive").to_json()
    held = report["decisions"]
    second = next(j["id"] for j in report["jobs"] if j["name"] == "b")
    assert held["held_with_room"] >= 1
    first = held["held_with_room_first"][0]
    assert (first["job"], first["gpu"], first["claim_bytes"]) == (second, 0, 2**30)
    assert first["free_bytes"] >= 2**30 and first["t"] >= 0
    fifo = q.run(write_queue(tmp_path / "f.toml", jobs), "fifo").to_json()
    assert fifo["decisions"]["held_with_room"] == 0  # both fit at once: none held


def test_add_list_log_and_json_through_the_cli(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    code = "import os; print('in', os.getcwd(), os.environ['MY_SETTING'])"
    added = memgov_cli(
        "queue",
        "add",
        "--name",
        "hello",
        "--claim",
        "1GiB",
        "--",
        "python3",
        "-c",
        code,
        cwd=work,
        env={"MY_SETTING": "kept"},
    )
    assert added.returncode == 0, added.stderr
    listed = memgov_cli("queue", "--json")
    (job,) = json.loads(listed.stdout)["jobs"]
    assert job["name"] == "hello" and job["state"] == "queued" and job["env"] is None
    ran = memgov_cli("queue", "run", "--json", "--out", str(tmp_path / "r.json"))
    assert ran.returncode == 0, ran.stderr
    assert json.loads((tmp_path / "r.json").read_text())["jobs"][0]["end"] == "ok"
    log = memgov_cli("queue", "log", str(job["id"]))
    assert f"in {work} kept" in log.stdout
    assert "hello" in memgov_cli("queue").stdout
    missing = memgov_cli("queue", "log", "99")
    assert missing.returncode == 2 and "no job 99" in missing.stderr


def test_the_report_has_the_agreed_keys(tmp_path: Path) -> None:
    path = write_queue(tmp_path / "q.toml", [{"cmd": sleeper(0.1), "kind": "k", "duration": 1}])
    report = q.run(path).to_json()
    assert {
        "policy",
        "makespan_s",
        "jobs",
        "decisions",
        "samples",
        "ooms",
        "killed_by_neighbour",
        "retries",
        "device",
    } <= set(report)
    assert report["policy"] == "memgov"
    assert set(report["decisions"]) == {
        *("count", "p50_ms", "p99_ms", "max_ms"),
        *("held_with_room", "held_with_room_first"),
    }
    assert report["max_slowdown"] is None  # none asked for
    assert set(report["device"]) == {"name", "total_bytes"}
    row = report["jobs"][0]
    assert {
        "name",
        "kind",
        "gpu",
        "claim_bytes",
        "peak_bytes",
        "arrival_s",
        "start_s",
        "end_s",
        "jct_s",
        "run_s",
        "solo_s",
        "slowdown",
        "end",
        "ooms",
        "retries",
    } <= set(row)
    for sample in report["samples"]:
        assert set(sample) >= {"t", "used_bytes", "claimed_bytes", "util_pct"}


@pytest.mark.parametrize("fmt", ["table", "json"])
def test_run_prints_a_table_or_json_and_plots(tmp_path: Path, fmt: str) -> None:
    path = write_queue(tmp_path / "q.toml", [{"cmd": sleeper(0.1)}])
    args = ["queue", "run", str(path), "--plot", str(tmp_path / "p.png")]
    result = memgov_cli(*args, *(["--json"] if fmt == "json" else []))
    assert result.returncode == 0, result.stderr
    if fmt == "json":
        assert json.loads(result.stdout)["jobs"][0]["end"] == "ok"
    else:
        assert "makespan" in result.stdout
    pytest.importorskip("matplotlib")
    assert (tmp_path / "p.png").stat().st_size > 0
