"""memgov in real containers: examples/docker's image, `memgov pack --runner docker`, users.

Each test needs the ``docker_image`` fixture (conftest.py): an engine that answers or one this
session could install and start, else every test here is skipped with the reason.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from ..pack._util import held

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
MNIST = ROOT / "experiments" / "mnist"
sys.path.insert(0, str(HERE))

import killstop_check  # noqa: E402
import users_check  # noqa: E402

TINY = ["--", "--limit", "64", "--eval-limit", "32"]


def _pack(
    image: str,
    out: Path,
    *args: str,
    env: dict[str, str] | None = None,
    trainer: list[str] = TINY,
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    argv = killstop_check.pack_argv(
        image, "--epochs", "1", "--no-progress", "--out", str(out), *args, str(MNIST), *trainer
    )
    done = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**os.environ, **(env or {})},
    )
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").exists() else {}
    return done, report


def _pack_containers() -> list[str]:
    got = subprocess.run(
        ["docker", "ps", "-a", "--filter", "name=^memgov-pack-", "--format", "{{.Names}}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return got.stdout.split()


def _records(ledger: Path) -> list[str]:
    return sorted(p.name for p in ledger.glob("v1/*/claims/*.json"))


def test_pack_refuses_clearly_when_no_engine_answers(tmp_path: Path) -> None:
    """No fixture: runs wherever a docker client is; the engine's socket is one that is not."""
    if subprocess.run(["sh", "-c", "command -v docker"], capture_output=True).returncode != 0:
        pytest.skip("no docker client on PATH (tests/pack covers that refusal)")
    done, _report = _pack(
        "memgov-mnist",
        tmp_path / "out",
        "--n",
        "1",
        env={"DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"},
    )
    assert done.returncode == 2, done.stderr
    assert "--runner docker: no container engine answers" in done.stderr
    assert not (tmp_path / "out" / "report.json").exists()


def test_docker_pack_runs_governed_containers(
    docker_image: str, tmp_path: Path, private_ledger: Path
) -> None:
    before = set(_pack_containers())
    done, report = _pack(
        docker_image,
        tmp_path / "out",
        *("--n", "3", "--no-solo", "--host-per-job", "off"),
        trainer=[*TINY, *held(Path("/tmp/memgov-test-hold"))],  # a folder in each container
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert report["runner"] == "docker" and report["ok"] == 3 and report["failed"] == 0
    for job in report["jobs"]:
        # claimed through the bind-mounted ledger: seen there by pack on the host, or (a job
        # too short for pack's sampling) as the job reported it; the next test shows the host's
        # claims reach the containers' ledger
        assert job["claim_mib"] == 1024.0 and job["claim_mode"] == "soft"
        assert job["claim_seen"] in ("ledger", "job")
        assert job["container"].startswith("memgov-pack-") and job["exit_code"] == 0
        # host USS of the container's own processes (its cgroup), not of the docker client
        assert job["uss_mib"] and job["uss_mib"] > 50
        assert job["measured_host_pids"] and job["host_pid"] not in job["measured_host_pids"]
        assert job["samples"] == 64
    assert set(_pack_containers()) <= before  # --rm: nothing left
    assert _records(private_ledger) == []


def test_docker_pack_on_a_full_device_refuses_with_the_reason(
    docker_image: str, tmp_path: Path, private_ledger: Path
) -> None:
    # A host process holds 1.5 GiB of a simulated 2 GiB device, so no container's 1 GiB claim
    # fits (jobs run with MEMGOV_STRICT=1). All refused rather than "some": how many of a few
    # short jobs overlap depends on how fast the engine starts them.
    env = {**os.environ, "MEMGOV_DEVICES": "sim0:2GiB"}
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import memgov, sys; memgov.claim('1536MiB', name='host-holder');"
            " print('held', flush=True); sys.stdin.read()",
        ],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        done, report = _pack(
            docker_image,
            tmp_path / "out",
            "--n",
            "2",
            "--no-solo",
            "--host-per-job",
            "off",
            env={"MEMGOV_DEVICES": "sim0:2GiB"},
        )
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=60)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert report["ok"] == 0 and report["reasons"] == {"budget_refused": 2}
    for job in report["jobs"]:
        assert "BudgetExceeded" in job["detail"] and "host-holder" in job["detail"], job
        assert job["claim_mib"] is None
    assert _records(private_ledger) == []


def test_kill_stop_and_ctrl_c_leave_nothing(docker_image: str) -> None:
    # Not under pytest's tmp_path: another pytest of the same user prunes old base folders,
    # and this test's pack writes its report there after a minute.
    base = Path(tempfile.mkdtemp(prefix="memgov-test-killstop-"))
    try:
        got = killstop_check.run(base / "ks", docker_image)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    assert got["docker_kill"] == 0 and got["docker_stop"] == 0
    # the killed container's budget is free at the first look at the ledger after `docker kill`
    assert got["kill_claim_gone_s"]["looks"] == 1, got
    assert got["stop_claim_gone_s"]["s"] is not None, got
    jobs = got["jobs"]
    assert (jobs["docker_kill"]["reason"], jobs["docker_kill"]["signal"]) == ("killed", 9)
    assert (jobs["docker_stop"]["reason"], jobs["docker_stop"]["signal"]) == ("killed", 15)
    assert jobs["ctrl_c"]["reason"] == "interrupted" and got["report_interrupted"] is True
    assert got["pack_exit"] == 130
    assert got["containers_left"] == [] and got["claims_left"] == {}
    assert got["record_files_left"] == []


def test_users_and_userns_remap_cannot_alter_each_others_records(
    docker_image: str, userns_engine: str, tmp_path: Path
) -> None:
    base = Path("/tmp") / f"memgov-test-users-{os.getpid()}"  # reachable by every uid
    try:
        got = users_check.run(docker_image, base, userns_engine)
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)
    owners = sorted(got["record_owners"].values())
    # userns root is an unprivileged host uid: dockremap's first subordinate uid (231072 where
    # useradd had given 100000-231071 to two users before dockerd made dockremap)
    assert got["userns_root_uid"] != 0, got["userns_root_uid"]
    assert owners == sorted([0, 1001, 1002, got["userns_root_uid"]]), owners
    claims = got["status"]["devices"][0]["claims"]
    assert sorted(c["host"] for c in claims) == sorted(h["host"] for h in got["holders"].values())
    for name in ("uid1001", "uid1002", "userns-root"):
        assert got["records_intact_after"][name], got["tamper"][name]
        for attempt in got["tamper"][name]["results"].values():
            assert "done" not in attempt.values(), (name, attempt)
    assert got["status_after"]["devices"][0]["claims"] == []


def test_the_remapped_root_is_dockremaps_lowest_subordinate_uid() -> None:
    """As Docker maps it: ranges sorted, container root is the first range's start; the owner
    may be named by uid; other users' ranges and malformed lines do not count."""
    subuid = "mgl_a:100000:65536\nmgl_b:165536:65536\ndockremap:231072:65536\nbroken line\n"
    assert users_check.remapped_root_uid(subuid) == 231072
    later_first = "dockremap:400000:65536\nmgl_a:100000:65536\ndockremap:300000:65536\n"
    assert users_check.remapped_root_uid(later_first) == 300000
    with pytest.raises(RuntimeError, match="no subordinate uid range for dockremap"):
        users_check.remapped_root_uid("mgl_a:100000:65536\n")


def test_cpus_quota_gives_that_many_threads(docker_image: str) -> None:
    """`docker run --cpus N`: the governed trainer's share is N threads, not the host's cores.
    The quota is read by memgov._cpu.cpus (the CPU thread budget); xfail where it is missing."""
    try:
        import memgov._cpu.cpus  # noqa: F401
    except ImportError:
        pytest.xfail("cgroup CPU quota reading (memgov._cpu.cpus, thread-budget issue) not merged")
    cores = len(os.sched_getaffinity(0))
    for cpus in sorted({1, min(2, cores)}):
        got = subprocess.run(
            [
                "docker",
                "run",
                "--rm",
                "--init",
                "--network",
                "none",
                f"--cpus={cpus}",
                "-e",
                "MEMGOV_DEVICES=sim0:8GiB",
                "-e",
                "MEMGOV_DIR=/tmp/ledger",
                "-e",
                "MEMGOV_CLAIM=1GiB",
                "--entrypoint",
                "python",
                docker_image,
                "-c",
                "import torch; print(torch.get_num_threads())",
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert got.returncode == 0, got.stderr[-1000:]
        threads, why = int(got.stdout.split()[-1]), (cpus, got.stdout, got.stderr[-800:])
        assert f"CPU quota {cpus} " in got.stderr, why
        assert f"{cpus} usable core(s) / 1 governed process(es) on them -> {cpus}" in got.stderr
        # The share is the quota; it starts lower only where the host's other work held every
        # core at that instant (docs/threads.md: a share starts within the free cores).
        held_back = "runnable elsewhere on the host now" in got.stderr
        assert threads == cpus or (held_back and 1 <= threads < cpus), why
