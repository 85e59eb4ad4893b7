"""A new user's first `memgov pack mnist`: what it says when no GPU is there, when a job's budget
is refused, and when the trainer cannot import numpy (memgov installed without its [torch]
extra)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from memgov._gpu import nvml as _nvml
from tests.helpers.procs import run_memgov

MNIST = str(Path(__file__).resolve().parents[2] / "experiments" / "mnist")


def pack(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return run_memgov("pack", *argv, env=env, timeout=600)


def failed_lines(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in result.stdout.splitlines() if line.startswith("failed ")]


def test_no_gpu_points_at_a_cpu_pack_not_at_simulated_gpus_it_refuses(env, tmp_path):
    if _nvml.unavailable_reason() is None:
        pytest.skip("this machine has working NVML (a GPU): the no-GPU message does not apply")
    del env["MEMGOV_DEVICES"]
    result = pack(env, "--out", str(tmp_path / "out"), MNIST)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "pack on CPU with --device cpu" in result.stderr
    assert "simulate some with MEMGOV_DEVICES" not in result.stderr  # a GPU pack refuses them
    simulated = pack({**env, "MEMGOV_DEVICES": "sim0:16GiB"}, "--out", str(tmp_path), MNIST)
    assert simulated.returncode == 2 and "--device cpu" in simulated.stderr


def test_a_refused_budget_says_pack_s_option_in_a_whole_line(env, tmp_path):
    env["MEMGOV_DEVICES"] = "sim0:1GiB"  # one 900 MiB job fits, not two
    result = pack(
        env, "--device", "cpu", "-n", "2", "--claim", "900MiB", "--out", str(tmp_path), MNIST
    )
    refused = [line for line in failed_lines(result) if "budget_refused" in line]
    assert refused, result.stdout[-3000:]
    for line in refused:
        assert line.endswith("; pass --wait SECONDS to queue each job for its budget"), line
        assert "wait=" not in line


def test_without_numpy_pack_says_in_one_line_what_to_install(env, tmp_path):
    """numpy is a dependency of memgov itself (its decision core): an environment that lost it
    gets one line naming it, not a traceback, and no job starts."""
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    (hidden / "numpy.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'numpy'\", name='numpy')\n"
    )
    env["PYTHONPATH"] = str(hidden)
    result = pack(env, "--device", "cpu", "-n", "1", "--out", str(tmp_path / "out"), MNIST)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "memgov: numpy is missing, a dependency of memgov-gpu: pip install numpy"
    ), result.stderr[-2000:]
    assert "Traceback" not in result.stderr
