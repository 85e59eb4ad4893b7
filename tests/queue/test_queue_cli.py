"""The queue's user side: `serve` says what starts and ends (lines, or JSON lines), `run` refuses
up front what it could not finish (--plot without matplotlib, --ray without Ray), and
`memgov.queue.add` takes the dicts its docs show."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import memgov.queue as q
from memgov._base.errors import ConfigError
from tests.helpers.queuejobs import ROOT, memgov_cli, write_queue
from tests.queue.test_queue_runner import cli_proc, wait_for


def _serve_until_done(*args: str) -> list[str]:
    """`memgov queue serve ARGS` until both queued jobs ended, then Ctrl-C: its stdout lines."""
    serve = cli_proc("queue", "serve", "--grace", "1", *args)
    try:
        wait_for(lambda: all(j.state in ("done", "failed") for j in q.jobs()[0]))
    finally:
        serve.send_signal(signal.SIGINT)
        out, err = serve.communicate(timeout=60)
    assert serve.returncode == 130, err
    return out.splitlines()


def _add_two() -> tuple[int, int]:
    good = memgov_cli("queue", "add", "--json", "--name", "good", "--claim", "1GiB", "--", "true")
    bad = memgov_cli("queue", "add", "--json", "--name", "bad", "--claim", "1GiB", "--", "false")
    return json.loads(good.stdout)["id"], json.loads(bad.stdout)["id"]


def test_serve_says_in_json_lines_what_starts_and_ends_and_the_report_last() -> None:
    good, bad = _add_two()
    events = [json.loads(line) for line in _serve_until_done("--json")]
    assert events[0]["event"] == "serving" and len(events[0]["gpus"]) == 2
    said = {(e["event"], e["id"]): e for e in events[1:-1]}
    assert set(said) == {("start", good), ("end", good), ("start", bad), ("end", bad)}
    assert said[("start", good)]["claim_bytes"] == 2**30
    assert said[("end", good)]["result"] == "ok" and said[("end", bad)]["result"] == "failed"
    assert said[("end", bad)]["returncode"] == 1
    report = events[-1]
    assert report["interrupted"] == signal.SIGINT and len(report["jobs"]) == 2


def test_serve_says_a_line_as_each_job_starts_and_ends() -> None:
    good, bad = _add_two()
    out = _serve_until_done()
    assert out[0].startswith("serving the queue: policy memgov on gpu 0 16.00 GiB, gpu 1 16.00 GiB")
    for job_id, name, end in ((good, "good", "ok"), (bad, "bad", "failed")):
        started = [line for line in out if line.startswith(f"started: job {job_id} ({name}) on")]
        ended = [line for line in out if line.startswith(f"ended {end}: job {job_id} ({name}) on")]
        assert len(started) == 1 and len(ended) == 1, out
        assert out.index(started[0]) < out.index(ended[0])


@pytest.fixture
def hidden(tmp_path: Path) -> dict[str, str]:
    """An environment where matplotlib and ray cannot be imported (as if not installed)."""
    folder = tmp_path / "hidden"
    folder.mkdir()
    for module in ("matplotlib", "ray"):
        (folder / f"{module}.py").write_text(f"raise ImportError('No module named {module}')\n")
    return {"PYTHONPATH": f"{folder}:{ROOT}"}


@pytest.mark.parametrize(
    ("option", "needed"), [("--plot", "--plot needs matplotlib"), ("--ray", "--ray needs Ray")]
)
def test_run_refuses_what_it_could_not_finish_before_any_job_runs(
    tmp_path: Path, hidden: dict[str, str], option: str, needed: str
) -> None:
    mark = tmp_path / "ran"
    job = {"cmd": [sys.executable, "-c", f"open({str(mark)!r}, 'w')"], "claim": "1GiB"}
    path = write_queue(tmp_path / "jobs.toml", [job])
    out = tmp_path / "report.json"
    value = str(tmp_path / "run.png") if option == "--plot" else "auto"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "memgov",
            "queue",
            "run",
            "--out",
            str(out),
            option,
            value,
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **hidden},
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"memgov: {needed}") and result.stderr.count("\n") == 1
    assert "memgov-gpu[" in result.stderr  # what to install
    assert not mark.exists() and not out.exists()
    assert q.jobs()[0] == []  # nothing queued either


def test_add_takes_the_job_dicts_of_its_docs(tmp_path: Path) -> None:
    mark = tmp_path / "ran"
    code = f"open({str(mark)!r}, 'w')"
    (job,) = q.add([{"cmd": [sys.executable, "-c", code], "claim": "1GiB", "name": "from a dict"}])
    assert (job.name, job.claim) == ("from a dict", 2**30)
    assert [j.id for j in q.jobs()[0]] == [job.id]
    ran = memgov_cli("queue", "run")
    assert ran.returncode == 0, ran.stderr
    assert mark.exists()
    with pytest.raises(ConfigError, match="accepted a list of job dicts or JobSpecs"):
        q.add({"cmd": ["true"]})  # type: ignore[arg-type]


def test_a_queued_jobs_claim_is_named_by_its_job(tmp_path: Path) -> None:
    said = tmp_path / "claim"
    code = f"import torch, memgov; open({str(said)!r}, 'w').write(memgov.current().name)"
    job = {"cmd": [sys.executable, "-c", code], "claim": "1GiB", "name": "named"}
    ran = memgov_cli("queue", "run", str(write_queue(tmp_path / "jobs.toml", [job])))
    assert ran.returncode == 0, ran.stderr
    (stored,) = q.jobs()[0]
    assert stored.last is not None
    name, _, pid = said.read_text().rpartition(":")
    assert name == stored.job and pid == str(stored.last.pid)  # as `memgov profiles` lists it
