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
from collections.abc import Callable
from pathlib import Path

import pytest

import memgov.queue as q
from memgov._devices import candidates
from memgov._ledger import DeviceLedger
from memgov.queue.queuefile import job_spec
from memgov.queue.store import Store
from tests.helpers.queuejobs import ROOT, memgov_cli, sleeper, write_queue


def lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def wait_for(check: Callable[[], object], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def cli_proc(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "memgov", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        start_new_session=True,
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
