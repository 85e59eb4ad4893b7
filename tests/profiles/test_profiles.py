"""Profiles and ``auto`` (docs/profiles.md), with real processes on a simulated GPU: what a job is,
what its runs leave behind (also when SIGKILLed), what ``auto`` then claims, OOM learning, give
back, the store's bounds and bad files. On a simulated GPU memgov measures a process's peak
resident host memory (VmHWM), so the MiB job.py touches is what its profile records."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from memgov._base.errors import ConfigError, ProfileError
from memgov._files import flock as _flock
from memgov._profiles import autosize as _autosize, jobid as _jobid, store as _profiles

JOB = Path(__file__).with_name("job.py")


def holding(env: dict[str, str], *args: str, **popen: Any) -> subprocess.Popen[str]:
    """job.py ARGS --hold stdin: it holds what it claimed until a line comes on its stdin."""
    return subprocess.Popen(
        [sys.executable, str(JOB), *args, "--hold", "stdin"],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        **popen,
    )


MiB = 2**20


def run_job(
    env: dict[str, str], *args: str, cwd: Path | None = None, script: str | None = None
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, script or str(JOB), *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )
    events = {e["event"]: e for e in map(json.loads, done.stdout.splitlines())}
    return done, events


def memgov_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "memgov", *args], env=env, capture_output=True, text=True, timeout=60
    )


def show(env: dict[str, str], job: str) -> dict[str, Any]:
    done = memgov_cli(env, "profiles", "show", job, "--json")
    assert done.returncode == 0, done.stderr
    data: dict[str, Any] = json.loads(done.stdout)
    return data


def store(ledger: Path) -> Path:
    return ledger / "v1" / "_profiles" / str(os.geteuid())


# -- identity ------------------------------------------------------------------------------------


def test_same_script_from_another_folder_and_another_seed_is_one_job(env, tmp_path) -> None:
    _, here = run_job(env, "10", "--seed", "1", cwd=JOB.parent, script="job.py")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    relative = os.path.relpath(JOB, elsewhere)
    _, there = run_job(env, "10", "--seed=2", cwd=elsewhere, script=relative)
    assert here["claimed"]["job"] == there["claimed"]["job"]
    assert here["claimed"]["job"].startswith("job.py-")
    assert show(env, here["claimed"]["job"])["runs"] == 2
    assert there["claimed"]["sized"] == "profile"  # the first run's peak sized the second


def test_other_arguments_are_another_job(env) -> None:
    _, small = run_job(env, "10")
    _, large = run_job(env, "20")
    assert small["claimed"]["job"] != large["claimed"]["job"]
    assert large["claimed"]["sized"] == "first-run"


def test_the_job_named_by_memgov_job_claim_job_and_memgov_run_job(env) -> None:
    _, named = run_job({**env, "MEMGOV_JOB": "mnist-b64"}, "10")
    assert named["claimed"]["job"] == "mnist-b64"
    _, api = run_job({**env, "MEMGOV_JOB": "ignored"}, "10", "--job", "api-job")
    assert api["claimed"]["job"] == "api-job"  # claim(job=...) wins over the variable
    done = memgov_cli(env, "run", "--job", "from-run", "--", sys.executable, str(JOB), "10")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[0])["job"] == "from-run"
    bad = memgov_cli(env, "run", "--job", "x" * 129, "--", sys.executable, str(JOB), "10")
    assert bad.returncode == 2 and "accepted a job name of 1 to 128" in bad.stderr
    assert {
        p["job"] for p in json.loads(memgov_cli(env, "profiles", "--json").stdout)["profiles"]
    } == {"mnist-b64", "api-job", "from-run"}


def test_derived_identity_rules(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    name, label = _jobid.derive(["python3", str(script), "--lr", "1", "--outf", "/tmp/a"])
    assert label == "train.py"
    assert _jobid.derive(["/venv/bin/python", "-u", str(script), "--lr", "1"])[0] == name
    assert _jobid.derive(["python", str(script), "--lr", "2"])[0] != name
    assert _jobid.derive(["python", "-c", "print(1)"])[1] == "python-c"
    assert _jobid.derive(["python", "-m", "pkg.train", "--x"])[1] == "pkg.train"
    assert _jobid.kept_arguments(["--seed", "3", "--save-model", "--seed=4", "--out", "d"]) == [
        "--save-model"
    ]
    with pytest.raises(ConfigError, match="accepted a job name"):
        _jobid.job_for("bell\x07")


# -- what a run leaves, and what auto claims then ------------------------------------------------


def test_a_first_run_then_its_profile_sizes_the_next(env) -> None:
    _, first = run_job(env, "120", "--job", "learn")
    line = first["claimed"]["line"]
    assert first["claimed"]["sized"] == "first-run" and line.startswith("auto: 4.00 GiB = first")
    runs = show(env, "learn")["history"]
    peak = runs[0]["peak"]
    assert runs[0]["end"] == "exit" and runs[0]["measure"] == "host-rss" and peak >= 120 * MiB
    done, second = run_job(env, "120", "--job", "learn")
    assert second["claimed"]["bytes"] == _profiles.margin(peak)
    expected = f"peak {peak / MiB:,.0f} MiB over 1 run of learn + 10 % + 64 MiB"
    assert expected in second["claimed"]["line"]
    assert f"memgov: {second['claimed']['line']}" in done.stderr  # every auto claim says it


def test_out_of_memory_is_recorded_and_the_next_claim_asks_for_more(env) -> None:
    run_job(env, "60", "--job", "oomy")  # first run: its peak is known
    done, failed = run_job(env, "60", "--job", "oomy", "--end", "oom")
    assert done.returncode == 1 and "MemoryError" in done.stderr
    size = failed["claimed"]["bytes"]
    _, after = run_job(env, "60", "--job", "oomy")
    grown = -(-int(size * _profiles.OOM_GROWTH) // MiB) * MiB
    assert after["claimed"]["bytes"] == grown
    assert (
        "1.5 x the" in after["claimed"]["line"] and "ran out of memory" in after["claimed"]["line"]
    )
    # A run at that size ended well: the measured peak sizes the job again.
    _, settled = run_job(env, "60", "--job", "oomy")
    history = show(env, "oomy")["history"]
    assert [r["end"] for r in history] == ["exit", "oom", "exit", "exit"]
    assert settled["claimed"]["bytes"] == _profiles.margin(max(r["peak"] for r in history[:3]))


def test_an_error_that_is_not_memory_is_recorded_as_error(env) -> None:
    done, _ = run_job(env, "10", "--job", "broken", "--end", "error")
    assert done.returncode == 1
    assert show(env, "broken")["history"][-1]["end"] == "error"


def test_a_sigkilled_process_still_gets_its_peak_recorded(env, private_ledger) -> None:
    child = holding(env, "150", "--job", "killed")
    try:
        assert child.stdout is not None
        while json.loads(child.stdout.readline())["event"] != "used":
            pass
        live = store(private_ledger) / "live"
        deadline = time.monotonic() + 60
        while _live_peak(live) < 150 * MiB:  # the sampler writes its peak within a second
            assert time.monotonic() < deadline, "the live file never showed the peak"
            time.sleep(0.1)
        child.send_signal(signal.SIGKILL)  # no exit handler runs
        child.wait(timeout=30)
    finally:
        child.kill()
    last = show(env, "killed")["history"][-1]
    assert last["end"] == "killed" and last["peak"] >= 150 * MiB
    assert list(live.iterdir()) == []  # folded and removed by the reader


def _live_peak(live: Path) -> int:
    peaks = [0]
    for path in live.glob("*.json"):
        try:
            peaks.append(json.loads(path.read_text())["run"]["peak"] or 0)
        except (OSError, ValueError, KeyError):
            continue
    return max(peaks)


def test_give_back_shrinks_a_first_run_claim_once_its_peak_is_flat(env) -> None:
    env = {**env, "MEMGOV_GIVE_BACK": "1"}
    child = holding(env, "80", "--job", "giver", stderr=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdin is not None
        first = json.loads(child.stdout.readline())
        assert first["sized"] == "first-run"
        deadline = time.monotonic() + 60
        while True:
            claims = json.loads(memgov_cli(env, "status", "--json").stdout)["devices"][0]["claims"]
            assert claims[0]["sized"] == "first-run" and claims[0]["job"] == "giver"
            if claims[0]["bytes"] < first["bytes"]:
                break
            assert time.monotonic() < deadline, "the first-run claim never gave memory back"
            time.sleep(0.2)
        child.stdin.write("\n")
        child.stdin.flush()
        out, err = child.communicate(timeout=60)
    finally:
        child.kill()
    ending = [json.loads(line) for line in out.splitlines()][-1]
    assert ending["bytes"] == claims[0]["bytes"]
    assert "give back: 4.00 GiB ->" in err and "returned to the ledger" in err
    peak = show(env, "giver")["history"][-1]["peak"]
    assert claims[0]["bytes"] <= _profiles.margin(peak)


def test_give_back_off_keeps_the_claim(env) -> None:
    _, events = run_job({**env, "MEMGOV_GIVE_BACK": "off"}, "10", "--job", "keeper", "--hold", "3")
    assert events["ending"]["bytes"] == events["claimed"]["bytes"]
    assert events["ending"]["give_back"] is None


def test_auto_enable_sizes_from_the_profile(env, py) -> None:
    env = {**env, "MEMGOV_CLAIM": "auto"}
    code = "import torch; import memgov; print(memgov.current().sized)"
    first = py(code, env)
    assert first.returncode == 0 and first.stdout.strip() == "first-run", first.stderr
    assert "memgov: auto: 4.00 GiB = first run of python-c" in first.stderr
    second = py(code, env)
    assert second.stdout.strip() == "profile", second.stderr
    assert "over 1 run of python-c + 10 % + 64 MiB" in second.stderr


def test_a_first_run_takes_half_of_what_is_free_never_a_neighbours_budget(env) -> None:
    # 14 of 16 GiB held by a neighbour: the first run asks half of the 2 GiB left (at least
    # 1 GiB), and the neighbour keeps all of its budget.
    neighbour = holding(env, "1", "--size", "14GiB", "--job", "neighbour")
    try:
        assert neighbour.stdout is not None and neighbour.stdin is not None
        json.loads(neighbour.stdout.readline())
        _, events = run_job(env, "10", "--job", "newcomer")
        assert events["claimed"]["bytes"] == 1 * 2**30
        assert "half of the 2.00 GiB free budget" in events["claimed"]["line"]
        neighbour.stdin.write("\n")
        neighbour.stdin.flush()
        assert neighbour.wait(timeout=60) == 0
    finally:
        neighbour.kill()


# -- the store: forget, bounds, bad files --------------------------------------------------------


def test_forget(env) -> None:
    run_job(env, "10", "--job", "gone")
    done = memgov_cli(env, "profiles", "forget", "gone")
    assert done.returncode == 0 and "forgot gone" in done.stdout
    again = memgov_cli(env, "profiles", "forget", "gone")
    assert again.returncode == 2 and "no profile for job 'gone'" in again.stderr
    _, after = run_job(env, "10", "--job", "gone")
    assert after["claimed"]["sized"] == "first-run"


def _run(peak: int, end: str = "exit") -> dict[str, Any]:
    return {"peak": peak, "end": end, "time": time.time(), "claim": None, "simulated": True}


def test_bounds_runs_per_job_and_jobs_per_user(monkeypatch) -> None:
    _profiles.record("many", "many", [_run(n * MiB) for n in range(1, _profiles.KEEP + 6)])
    kept = _profiles.read("many")
    assert kept is not None and len(kept.runs) == _profiles.KEEP
    assert kept.runs[0]["peak"] == 6 * MiB  # the oldest went first
    monkeypatch.setattr(_profiles, "MAX_ENTRIES", 3)
    for n, job in enumerate(["many", *(f"job{n}" for n in range(5))]):
        if job != "many":
            _profiles.record(job, job, [_run(MiB)])
        with _flock.private_folder() as (fd, _):  # distinct ages, whatever the clock's resolution
            os.utime(_profiles.file_name(job), (n + 1e9, n + 1e9), dir_fd=fd)
    found, _ = _profiles.every()
    assert sorted(p.job for p in found) == ["job2", "job3", "job4"]


def test_a_bad_profile_gets_a_clear_error_and_loses_nothing(env, private_ledger) -> None:
    run_job(env, "10", "--job", "precious")
    path = store(private_ledger) / _profiles.file_name("precious")
    path.write_text("{ torn")
    done, events = run_job(env, "10", "--job", "precious")
    assert done.returncode == 0, done.stderr  # the program runs, sized as a first run
    assert events["claimed"]["sized"] == "first-run"
    assert path.read_text() == "{ torn"  # never overwritten
    assert len(list((store(private_ledger) / "live").glob("*.json"))) == 1  # the run is kept
    listing = memgov_cli(env, "profiles")
    assert listing.returncode == 0
    assert f"problem: profile {path} is not a memgov profile (corrupt JSON" in listing.stdout
    shown = memgov_cli(env, "profiles", "show", "precious")
    assert shown.returncode == 2 and "memgov profiles forget JOB` removes it" in shown.stderr
    assert memgov_cli(env, "profiles", "forget", "precious").returncode == 0
    kept = show(env, "precious")["history"]  # the kept run, folded in by the next reader
    assert len(kept) == 1 and kept[0]["end"] == "exit"


def test_symlinks_foreign_files_and_a_loose_folder(private_ledger, tmp_path) -> None:
    _profiles.record("mine", "mine", [_run(MiB)])
    folder = store(private_ledger)
    folder.chmod(0o755)
    outside = tmp_path / "outside.json"
    outside.write_text(json.dumps({"version": 1, "job": "evil", "runs": []}))
    os.symlink(outside, folder / _profiles.file_name("evil"))
    with pytest.raises(ProfileError, match="symlink"):
        _profiles.read("evil")
    assert folder.stat().st_mode & 0o777 == 0o700  # made private again
    if os.geteuid() == 0:  # only root can give a file to another user
        foreign = folder / _profiles.file_name("foreign")
        foreign.write_text(json.dumps({"version": 1, "job": "foreign", "runs": [_run(MiB)]}))
        os.chown(foreign, 65534, 65534)
        with pytest.raises(ProfileError, match="belongs to uid 65534, not you"):
            _profiles.read("foreign")
    huge = folder / _profiles.file_name("huge")
    huge.write_bytes(b" " * (_profiles.MAX_BYTES + 1))
    with pytest.raises(ProfileError, match="too large"):
        _profiles.read("huge")
    _, problems = _profiles.every()
    assert len(problems) == (3 if os.geteuid() == 0 else 2)


def test_oom_floor_rules() -> None:
    profile = _profiles.Profile(
        "j",
        "j",
        [
            {**_run(100 * MiB), "claim": 200 * MiB},
            {**_run(190 * MiB, "oom"), "claim": 200 * MiB},
        ],
    )
    size, why = _autosize.need(profile, simulated=True) or (0, "")
    assert size == 300 * MiB and "1.5 x the 200 MiB" in why
    profile.runs.append({**_run(150 * MiB), "claim": 300 * MiB})
    assert (_autosize.need(profile, simulated=True) or (0, ""))[0] == _profiles.margin(190 * MiB)
    assert _autosize.need(profile, simulated=False) is None  # never sized across device kinds


REPLACER = """
import sys
import memgov
from memgov import _runs
from memgov._profiles import store as _profiles

memgov.claim("1GiB", job="replaced")
run = _runs.current()
print("ready", flush=True)
for i in range(3000):  # a peak that grows: each growth replaces the run's file
    run.peak = (i + 1) * 4096
    _profiles.update_live(run.held, run.payload())
"""


def test_a_running_runs_replaced_file_is_never_folded_as_killed(env, monkeypatch) -> None:
    # A reader folds dead processes' runs; the old file of a live run, unlocked as its
    # replacement takes its name, is not one (folded, its old peak would size the next claims).
    monkeypatch.setenv("MEMGOV_DIR", env["MEMGOV_DIR"])
    monkeypatch.setenv("MEMGOV_DEVICES", env["MEMGOV_DEVICES"])
    child = subprocess.Popen(
        [sys.executable, "-c", REPLACER], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        while child.poll() is None:
            _profiles.collect()
        assert child.wait() == 0
    finally:
        child.kill()
    profile = _profiles.read("replaced")
    assert profile is not None and len(profile.runs) == 1  # its one run, as it ended
    assert profile.runs[0]["end"] in ("exit", "released")
