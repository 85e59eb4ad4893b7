"""Bad queue files get clear errors saying what is accepted; bad store files lose nothing."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import memgov.queue as q
from memgov._base.errors import ConfigError, QueueError
from memgov.queue.store import Store
from tests.helpers.queuejobs import memgov_cli, sleeper

BAD = {
    "not TOML": ("[[job]\ncmd = 1", "is not TOML.*accepted: an optional \\[queue\\]"),
    "no jobs": ("[queue]\npolicy = 'fifo'\n", "no jobs; write each as a \\[\\[job\\]\\]"),
    "unknown top key": ("[[job]]\ncmd = 'true'\n[jobs]\nx = 1\n", "unknown top-level key.*'jobs'"),
    "unknown job key": (
        "[[job]]\ncmd = 'true'\nclam = '2GiB'\n",
        "job 1.*unknown key\\(s\\) 'clam'; accepted: name, cmd, cwd, claim",
    ),
    "unknown queue key": (
        "[queue]\npolcy = 'x'\n[[job]]\ncmd = 'true'\n",
        "\\[queue\\] has unknown key.*accepted: policy",
    ),
    "bad size": (
        "[[job]]\ncmd = 'true'\nclaim = '2 gigs'\n",
        "claim '2 gigs': accepted 'auto' or a size such as 2GiB",
    ),
    "zero size": ("[[job]]\ncmd = 'true'\nclaim = 0\n", "claim 0: accepted 'auto' or a size"),
    "no cmd": ("[[job]]\nname = 'x'\n", "cmd is missing.*accepted a list of strings"),
    "cmd list of numbers": ("[[job]]\ncmd = [1, 2]\n", "accepted a list of strings"),
    "twice the name": (
        "[[job]]\ncmd = 'true'\nname = 'a'\n[[job]]\ncmd = 'false'\nname = 'a'\n",
        "names must be unique.*'a'",
    ),
    "no such cwd": ("[[job]]\ncmd = 'true'\ncwd = 'nowhere'\n", "cwd 'nowhere' is not a folder"),
    "negative arrival": (
        "[[job]]\ncmd = 'true'\narrival = -1\n",
        "arrival -1: accepted a number of seconds >= 0",
    ),
    "zero duration": (
        "[[job]]\ncmd = 'true'\nduration = 0\n",
        "duration 0: accepted a number of seconds > 0",
    ),
    "gpu as text": ("[[job]]\ncmd = 'true'\ngpu = '0'\n", "gpu '0': accepted a GPU index"),
    "env of numbers": (
        "[[job]]\ncmd = 'true'\nenv = { A = 1 }\n",
        "env must be a table of strings",
    ),
    "unbalanced quote": ('[[job]]\ncmd = "python \'x"\n', "cannot be split as a shell would"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_queue_file_says_what_is_accepted_and_runs_nothing(tmp_path: Path, case: str) -> None:
    text, message = BAD[case]
    path = tmp_path / "q.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        q.run(path)
    assert q.jobs()[0] == []  # nothing was queued


def test_the_cli_exits_2_with_the_message(tmp_path: Path) -> None:
    path = tmp_path / "q.toml"
    path.write_text("[[job]]\ncmd = 'true'\nclam = 1\n")
    result = memgov_cli("queue", "run", str(path))
    assert result.returncode == 2
    assert "unknown key(s) 'clam'; accepted:" in result.stderr
    missing = memgov_cli("queue", "run", str(tmp_path / "none.toml"))
    assert missing.returncode == 2 and "No such file" in missing.stderr
    bad_claim = memgov_cli("queue", "add", "--claim", "lots", "--", "true")
    assert bad_claim.returncode == 2 and "accepted 'auto' or a size" in bad_claim.stderr


def test_a_bad_job_file_is_named_kept_and_removed_only_by_cancel(tmp_path: Path) -> None:
    (good,) = q.add([q.JobSpec("ok", sleeper(0), str(tmp_path), {})])
    store = Store()
    bad = store.path / "jobs" / "7.json"
    bad.write_text("{torn")
    os.chmod(bad, 0o600)
    found, problems = q.jobs()
    assert [j.id for j in found] == [good.id]
    assert len(problems) == 1 and "7.json" in problems[0] and "corrupt JSON" in problems[0]
    report = q.run(None, "fifo").to_json()  # the good job runs; the bad file stays as it was
    assert [j["end"] for j in report["jobs"]] == ["ok"]
    assert bad.read_text() == "{torn"
    listed = memgov_cli("queue")
    assert "7.json" in listed.stderr
    assert "removed job file 7" in q.cancel(7)
    assert not bad.exists()


def test_a_symlink_in_place_of_the_store_is_refused(tmp_path: Path) -> None:
    store = Store()
    with store.folder():
        pass
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    os.rmdir(store.path)
    os.symlink(elsewhere, store.path)
    with pytest.raises(QueueError, match="symlink or not a folder"):
        q.jobs()
    result = memgov_cli("queue", "add", "--", "true")
    assert result.returncode == 2 and "never follows symlinks" in result.stderr
    assert list(elsewhere.iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="gives a folder to another uid: needs root")
def test_a_store_folder_another_user_made_is_refused(tmp_path: Path) -> None:
    store = Store()
    with store.folder():
        pass
    os.chown(store.path, 65534, 65534)
    with pytest.raises(QueueError, match="belongs to uid 65534, not you"):
        q.add([q.JobSpec("x", ["true"], str(tmp_path), {})])


def test_no_gpu_is_said_before_anything_is_queued(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from memgov._base.errors import NoDeviceError

    monkeypatch.delenv("MEMGOV_DEVICES")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    path = tmp_path / "q.toml"
    path.write_text("[[job]]\ncmd = 'true'\n")
    with pytest.raises(NoDeviceError, match="MEMGOV_DEVICES"):
        q.run(path)
    monkeypatch.setenv("MEMGOV_DEVICES", "sim0:16GiB")
    assert q.jobs()[0] == []


def test_queue_add_refuses_what_could_never_run_here(tmp_path: Path) -> None:
    # As `memgov run` does: said before the job is queued, not when it would run.
    cases = [
        (["--claim", "999TiB", "--", "true"], "is larger than the largest device"),
        (["--gpu", "2", "--", "true"], "gpu 2: accepted a GPU index of this host, 0..1"),
        (["--gpu", "1", "--claim", "20GiB", "--", "true"], "is larger than the device sim1"),
        (["--", str(tmp_path / "no-such-program")], "command not found"),
        (["--", "no-such-program-on-path"], "command not found"),
    ]
    for args, message in cases:
        result = memgov_cli("queue", "add", *args)
        assert result.returncode == 2, (args, result.stderr)
        assert message in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert q.jobs()[0] == []
    fine = memgov_cli("queue", "add", "--gpu", "1", "--claim", "2GiB", "--", "true")
    assert fine.returncode == 0, fine.stderr


def test_queue_run_refuses_outputs_it_could_not_write_before_anything_runs(
    tmp_path: Path,
) -> None:
    path = tmp_path / "q.toml"
    path.write_text("[[job]]\ncmd = 'true'\nclaim = '1GiB'\n")
    for option, target, message in (
        ("--out", tmp_path / "missing" / "r.json", "no folder"),
        ("--plot", tmp_path, "a folder; accepted a file path"),
    ):
        result = memgov_cli("queue", "run", option, str(target), str(path))
        assert result.returncode == 2 and message in result.stderr, result.stderr
    assert q.jobs()[0] == []  # nothing queued, nothing ran
    out = tmp_path / "r.json"
    ran = memgov_cli("queue", "run", "--out", str(out), str(path))
    assert ran.returncode == 0, ran.stderr
    assert json.loads(out.read_text())["jobs"][0]["end"] == "ok"


def test_queue_list_and_the_groups_json_flag(tmp_path: Path) -> None:
    added = memgov_cli("queue", "--json", "add", "--name", "x", "--", "true")
    assert added.returncode == 0 and json.loads(added.stdout)["name"] == "x"
    listed = memgov_cli("queue", "list")
    bare = memgov_cli("queue")
    assert listed.returncode == 0 and " x " in listed.stdout
    assert listed.stdout.split("added")[0] == bare.stdout.split("added")[0]
    for args in (("queue", "--json", "list"), ("queue", "list", "--json"), ("queue", "--json")):
        shown = memgov_cli(*args)
        assert [j["name"] for j in json.loads(shown.stdout)["jobs"]] == ["x"], args


def test_simulate_refuses_a_negative_seed_in_one_message(tmp_path: Path) -> None:
    result = memgov_cli(
        "queue",
        "simulate",
        "--trace",
        str(tmp_path / "t.csv"),
        "--nodes",
        str(tmp_path / "n.csv"),
        "--seed",
        "-1",
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "--seed" in result.stderr


def test_a_jobs_errors_name_it_once_and_say_why(tmp_path: Path) -> None:
    path = tmp_path / "q.toml"
    path.write_text("[[job]]\nname = 'gan'\ncmd = 'true'\nclam = 1\n")
    with pytest.raises(ConfigError, match=r"job 1 \('gan'\): unknown key\(s\) 'clam'"):
        q.run(path)
    path.write_text("[[job]]\nname = 'gan'\ncmd = 'true'\nclaim = 'abc'\n")
    with pytest.raises(ConfigError) as info:
        q.run(path)
    assert str(info.value).count("job 1 ('gan')") == 1
    assert str(info.value).endswith("(cannot read 'abc' as a size)")


def test_the_list_says_each_jobs_end_once_and_what_its_last_run_had(tmp_path: Path) -> None:
    path = tmp_path / "q.toml"
    path.write_text(
        "[[job]]\nname = 'bad'\ncmd = 'false'\nclaim = '1GiB'\n"
        "[[job]]\nname = 'good'\ncmd = 'true'\nclaim = '1GiB'\n"
    )
    assert memgov_cli("queue", "run", str(path)).returncode == 1
    listed = memgov_cli("queue", "list").stdout.splitlines()
    lines = {name: next(ln for ln in listed if f" {name} " in ln) for name in ("bad", "good")}
    assert " failed " in lines["bad"] and "(failed)" not in lines["bad"]
    assert " done (ok) " in lines["good"]
    assert "claim 1.00 GiB, last run 1,024 MiB on gpu " in lines["good"]
