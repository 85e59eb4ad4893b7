"""`memgov mps` without nvidia-cuda-mps-control (as on every machine without an NVIDIA driver)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from memgov._gpu import mps as _mps
from memgov._gpu.mpsctl import MpsError
from tests.helpers.procs import run_memgov


def mps(*args: str, path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": str(path)}  # a PATH without the MPS control program
    return run_memgov("mps", *args, env=env, timeout=60)


def test_start_fails_clearly_without_the_control_program(tmp_path: Path) -> None:
    result = mps("start", path=tmp_path)
    assert result.returncode == 2
    assert "nvidia-cuda-mps-control is not on PATH" in result.stderr
    assert "claims stay soft" in result.stderr
    assert "Traceback" not in result.stderr


def test_status_and_stop_report_no_daemon(tmp_path: Path, private_ledger: Path) -> None:
    result = mps("status", "--json", path=tmp_path)
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert (info["running"], info["binary"], info["servers"]) == (False, None, [])
    assert info["pipe"] == str(private_ledger / "mps" / "pipe")
    assert info["client_limit"] == 48
    result = mps("stop", path=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "no MPS daemon runs" in result.stdout


def test_daemon_context_fails_clearly_and_records_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(MpsError, match="not on PATH"), _mps.daemon():
        pass
    assert _mps.read_state() is None


def test_relative_memgov_dir_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMGOV_DIR", "relative/dir")
    result = mps("status", path=tmp_path)
    assert result.returncode == 2
    assert "must be an absolute path" in result.stderr
