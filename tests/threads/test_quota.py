"""The CPU quota is honoured: real cgroups made here (v1 on this machine; v2 where the kernel
offers its cpu controller), and the parser on copies of /proc files from other layouts."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from memgov._cpu import cpus as _cpus

V1_CPU = Path("/sys/fs/cgroup/cpu")
V2 = next(
    (
        p
        for p in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified"))
        if (p / "cgroup.controllers").exists()
    ),
    None,
)
CORES = len(os.sched_getaffinity(0))

PROBE = "import torch, os; print(torch.get_num_threads(), os.environ.get('OMP_NUM_THREADS'))"


def _v1_usable() -> str | None:
    if os.geteuid() != 0:
        return "making a cgroup needs root"
    if not (V1_CPU / "cpu.cfs_quota_us").exists():
        return "no cgroup v1 cpu controller mounted at /sys/fs/cgroup/cpu"
    return None


def _v2_usable() -> str | None:
    if os.geteuid() != 0:
        return "making a cgroup needs root"
    if V2 is None:
        return "no cgroup v2 hierarchy mounted"
    if "cpu" not in (V2 / "cgroup.controllers").read_text().split():
        return f"the cgroup v2 hierarchy at {V2} has no cpu controller (bound to v1 here)"
    return None


@contextlib.contextmanager
def cgroup(base: Path, settings: dict[str, str], child: bool) -> Iterator[Path]:
    """A cgroup with ``settings`` (and an unlimited child in it when ``child``), removed after."""
    top = base / f"memgov-test-{uuid.uuid4().hex[:8]}"
    top.mkdir()
    made = [top]
    try:
        for name, value in settings.items():
            (top / name).write_text(value)
        if child:
            made.append(top / "job")
            made[-1].mkdir()
        yield made[-1]
    finally:
        for folder in reversed(made):
            with contextlib.suppress(OSError):
                folder.rmdir()


def run_in(group: Path, env: dict[str, str]) -> list[str]:
    # The shell moves itself into the cgroup, then becomes python: the quota binds from start-up.
    script = f'echo $$ > {group}/cgroup.procs && exec "$0" -c "$1"'
    done = subprocess.run(
        ["sh", "-c", script, sys.executable, PROBE],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "CPU quota 1 (" in done.stderr, done.stderr[-3000:]
    return done.stdout.split()


@pytest.mark.root
@pytest.mark.skipif(CORES < 2, reason="a 1-CPU quota must be below the affinity mask's cores")
@pytest.mark.parametrize("on_parent", [False, True], ids=["own-cgroup", "parent-cgroup"])
def test_v1_quota_is_honoured(env: dict[str, str], on_parent: bool) -> None:
    why = _v1_usable()
    if why:
        pytest.skip(why)
    quota = {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "100000"}  # 1 CPU
    with cgroup(V1_CPU, quota, child=on_parent) as group:
        threads, omp = run_in(group, {**env, "MEMGOV_CLAIM": "1GiB"})
    assert (threads, omp) == ("1", "1")


@pytest.mark.root
@pytest.mark.skipif(CORES < 2, reason="a 1-CPU quota must be below the affinity mask's cores")
def test_v2_quota_is_honoured(env: dict[str, str]) -> None:
    why = _v2_usable()
    if why:
        pytest.skip(why)
    assert V2 is not None
    with cgroup(V2, {"cpu.max": "100000 100000"}, child=True) as group:
        threads, omp = run_in(group, {**env, "MEMGOV_CLAIM": "1GiB"})
    assert (threads, omp) == ("1", "1")


def fake_proc(tmp_path: Path, cgroup_lines: str, mounts: list[tuple[str, str, str, str]]) -> Path:
    proc = tmp_path / "proc"
    proc.mkdir(parents=True)
    (proc / "cgroup").write_text(cgroup_lines)
    lines = [
        f"{30 + i} 1 0:{40 + i} {root} {point} rw,relatime - {fs} {fs} {opts}"
        for i, (root, point, fs, opts) in enumerate(mounts)
    ]
    (proc / "mountinfo").write_text("\n".join(lines) + "\n")
    return proc


def write(folder: Path, **files: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name.replace("cpu_max", "cpu.max")).write_text(text)


def test_v2_parser_takes_the_strictest_limit_on_the_path(tmp_path: Path) -> None:
    fs = tmp_path / "cg"
    write(fs, cpu_max="max 100000\n")
    write(fs / "batch.slice", cpu_max="250000 100000\n")  # 2.5 CPUs: the parent binds
    write(fs / "batch.slice" / "job7", cpu_max="max 100000\n")
    proc = fake_proc(tmp_path, "0::/batch.slice/job7\n", [("/", str(fs), "cgroup2", "rw")])
    found = _cpus.cgroup_quota(proc)
    assert found is not None and found.cpus == 2.5
    assert found.source == str(fs / "batch.slice" / "cpu.max")
    usable = _cpus.Usable(frozenset(range(16)), found)
    assert usable.count == 3  # threads: 2.5 CPUs rounded up, fewer than the 16 cores


def test_parser_inside_a_container_with_its_own_cgroup_root(tmp_path: Path) -> None:
    """In a container the mount's root is the container's cgroup: the path is relative to it."""
    fs = tmp_path / "cg"
    write(fs, cpu_max="400000 100000\n")  # the container's own limit, at the mount's top
    proc = fake_proc(
        tmp_path, "0::/kubepods/pod1/c1\n", [("/kubepods/pod1/c1", str(fs), "cgroup2", "rw")]
    )
    found = _cpus.cgroup_quota(proc)
    assert found is not None and found.cpus == 4.0


def test_v1_parser_and_no_limit(tmp_path: Path) -> None:
    fs = tmp_path / "cpu"
    write(fs, **{"cpu.cfs_quota_us": "-1\n", "cpu.cfs_period_us": "100000\n"})
    write(fs / "docker" / "abc", **{"cpu.cfs_quota_us": "50000\n", "cpu.cfs_period_us": "100000\n"})
    lines = "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n0::/\n"
    proc = fake_proc(tmp_path, lines, [("/", str(fs), "cgroup", "rw,cpu,cpuacct")])
    found = _cpus.cgroup_quota(proc)
    assert found is not None and found.cpus == 0.5
    assert _cpus.Usable(frozenset({0, 1}), found).count == 1
    none = fake_proc(tmp_path / "b", "3:cpu,cpuacct:/\n", [("/", str(fs), "cgroup", "rw,cpu")])
    assert _cpus.cgroup_quota(none) is None


def test_odd_files_mean_no_quota_not_a_crash(tmp_path: Path) -> None:
    fs = tmp_path / "cg"
    write(fs, cpu_max="garbage here\n")
    proc = fake_proc(tmp_path, "0::/\n", [("/", str(fs), "cgroup2", "rw")])
    assert _cpus.usable(proc).quota is None
    assert _cpus.usable(tmp_path / "missing").quota is None
