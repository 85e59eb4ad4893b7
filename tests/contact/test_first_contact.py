"""A new user's first commands on a machine without a GPU: status, devices and doctor say how to
go on (simulated GPUs), and `memgov --version` answers."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest

from memgov._gpu import nvml as _nvml
from tests.helpers.procs import run_memgov

MEMGOV = [sys.executable, "-m", "memgov"]
HINT = 'simulate some to try memgov: MEMGOV_DEVICES="sim0:16GiB" memgov status'


def memgov(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return run_memgov(*argv, env=env, timeout=60)


@pytest.fixture
def no_gpu(env: dict[str, str]) -> dict[str, str]:
    if _nvml.unavailable_reason() is None:
        pytest.skip("this machine has working NVML (a GPU): the no-GPU hints do not apply")
    del env["MEMGOV_DEVICES"]
    return env


@pytest.mark.parametrize("command", ["status", "devices", "doctor"])
def test_no_gpu_commands_point_at_simulated_devices(no_gpu, command):
    result = memgov(no_gpu, command)
    assert result.returncode == 0, result.stderr
    assert HINT in result.stdout
    assert f"NVML: {_nvml.unavailable_reason()}" in result.stdout


def test_no_gpu_json_stays_json_and_says_why(no_gpu):
    result = memgov(no_gpu, "status", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["devices"] == [] and f"NVML: {_nvml.unavailable_reason()}" in data["no_gpu"]
    assert HINT in data["no_gpu"]


def test_doctor_fails_on_a_ledger_no_claim_can_use(env, py, tmp_path):
    claims = tmp_path / "ledger" / "v1" / "sim0" / "claims"
    claims.parent.mkdir(parents=True)
    claims.write_text("not a folder")  # every claim on sim0 fails on it
    claim = py("import memgov; memgov.claim('1GiB')", env, timeout=60)
    assert claim.returncode != 0 and "LedgerError" in claim.stderr
    result = memgov(env, "doctor")
    assert result.returncode == 1
    assert f"ledger PROBLEM: ledger folder {claims} is a symlink or not a folder" in result.stdout


def test_simulated_devices_need_no_hint(env):
    for command in ("status", "devices", "doctor"):
        result = memgov(env, command)
        assert result.returncode == 0 and HINT not in result.stdout, command


def test_version(env):
    import memgov as package

    result = memgov(env, "--version")
    assert result.returncode == 0
    assert result.stdout.startswith(f"memgov {package.__version__} (pip: memgov-gpu; ")


def test_no_gpu_watch_into_a_pipe_says_why_in_each_view(no_gpu):
    proc = subprocess.Popen(
        [*MEMGOV, "status", "--watch", "0.3"], env=no_gpu, stdout=subprocess.PIPE, text=True
    )
    guard = threading.Timer(60, proc.kill)  # views that never come fail, never hang
    guard.start()
    try:
        assert proc.stdout is not None
        seen = [proc.stdout.readline() for _ in range(40)]  # a few views, each written at once
    finally:
        guard.cancel()
        proc.kill()
        proc.wait(timeout=30)
    hints = [line for line in seen if HINT in line]
    assert len(hints) >= 2 and f"NVML: {_nvml.unavailable_reason()}" in hints[0], seen
