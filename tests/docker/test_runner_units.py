"""The docker runner's pieces that need no engine: its run line, exit codes, cgroup members."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from memgov.pack.runners import DockerRunner, cgroup_members


def test_run_line_inits_isolates_and_names_the_container() -> None:
    runner = DockerRunner("memgov-mnist", Path("/srv/ledger"), None, None)
    argv, _env, name = runner.launch(
        ["python", "train_torch.py"], {"MEMGOV_CLAIM": "1"}, Path("/x/mnist"), "job-07", {}
    )
    assert name is not None and name.startswith(runner.prefix) and "job-07" in name
    line = " ".join(argv)
    assert "--init" in argv and "--network none" in line
    assert f"--name {name} --hostname {name}" in line  # status names claims by hostname
    assert "-v /x/mnist:/experiment:ro" in line and "-v /srv/ledger:/srv/ledger" in line
    assert len(name) <= 63  # a hostname label


def test_exit_codes_of_docker_run_decode_to_the_trainers_signal() -> None:
    runner = DockerRunner("i", Path("/l"), None, None)
    assert runner.decode_exit(0) == (0, None)
    assert runner.decode_exit(2) == (2, None)
    assert runner.decode_exit(137) == (None, 9)  # docker kill
    assert runner.decode_exit(143) == (None, 15)  # docker stop / pack's SIGTERM via tini
    assert runner.decode_exit(-9) == (None, 9)  # the client itself was killed


def _fake(tmp_path: Path, theirs: str, mine: str, procs: dict[str, str]) -> tuple[Path, Path]:
    proc, cgroups = tmp_path / "proc", tmp_path / "cgroup"
    for pid, text in (("42", theirs), ("self", mine)):
        (proc / pid).mkdir(parents=True)
        (proc / pid / "cgroup").write_text(text)
    for path, members in procs.items():
        (cgroups / path).mkdir(parents=True)
        (cgroups / path / "cgroup.procs").write_text(members)
    return proc, cgroups


CGROUPS = {
    "v1-the-containers-pids-group": (
        "12:pids:/docker/abc\n4:memory:/docker/abc\n1:name=systemd:/docker/abc\n0::/\n",
        "12:pids:/\n4:memory:/\n1:name=systemd:/\n0::/\n",
        {"pids/docker/abc": "42\n57\n"},
        [42, 57],
    ),
    "v2-and-hybrid": (
        "0::/system.slice/docker-abc.scope\n",
        "0::/user.slice\n",
        {"unified/system.slice/docker-abc.scope": "42\n43\n"},
        [42, 43],
    ),
    # Same cgroup as pack (no container around the PID): listing it would count every process.
    "packs-own-group-refused": (
        "12:pids:/user\n0::/user\n",
        "12:pids:/user\n0::/user\n",
        {"pids/user": "1\n42\n", "user": "1\n42\n"},
        None,
    ),
}
"""PID 42's and pack's /proc/PID/cgroup, the cgroup folders' members, what cgroup_members says."""


@pytest.mark.parametrize(("theirs", "mine", "procs", "members"), CGROUPS.values(), ids=CGROUPS)
def test_cgroup_members(
    tmp_path: Path, theirs: str, mine: str, procs: dict[str, str], members: list[int] | None
) -> None:
    proc, cgroups = _fake(tmp_path, theirs, mine, procs)
    assert cgroup_members(42, proc, cgroups) == members
    assert cgroup_members(os.getpid() + 10**7, proc, cgroups) is None  # no such process
