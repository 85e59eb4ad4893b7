"""`memgov doctor`: what it reports, from a real CLI process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from memgov import _doctor


def doctor(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "memgov.cli", "doctor", *args],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_doctor_json(env):
    env.update(CUDA_DEVICE_MEMORY_LIMIT="4g", NVIDIA_GPU_MEMORY_LIMIT="8")
    result = doctor(env, "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert [d["uuid"] for d in report["devices"]] == ["sim0"]
    assert report["auto_enable"]["installed"] and report["auto_enable"]["triggered"]
    assert {"jax", "tensorflow", "torch"} <= set(report["frameworks"]["adapters"])
    (hami,) = report["budget"]["scheduler"]
    assert hami["enforced"] and hami["limit"] == 4 * 2**30
    assert "unit mistake" in report["budget"]["problems"][0]
    assert "HAMi CUDA_DEVICE_MEMORY_LIMIT='4g'" in report["budget"]["decision"]
    assert report["ledger"]["path"] == env["MEMGOV_DIR"]
    assert report["ledger"]["verdict"] in ("host", "private", "shared")


def test_doctor_text_explains_no_budget(env):
    result = doctor(env)
    assert result.returncode == 0, result.stderr
    assert "budget: no budget anywhere" in result.stdout
    assert "NVML: MEMGOV_DEVICES is set" in result.stdout


def test_ledger_verdicts(monkeypatch, tmp_path: Path):
    def mount(point, fstype, root="/"):
        return lambda path: {"point": point, "root": root, "fstype": fstype, "source": "x"}

    monkeypatch.setattr(_doctor, "in_container", lambda: True)
    monkeypatch.setattr(_doctor, "_mount_of", mount("/", "overlay"))
    assert _doctor.ledger_sharing(tmp_path)["verdict"] == "private"
    assert "WARNING" in _doctor.ledger_sharing(tmp_path)["note"]
    monkeypatch.setattr(_doctor, "_mount_of", mount("/tmp/memgov", "ext4", "/tmp/memgov"))
    assert _doctor.ledger_sharing(tmp_path)["verdict"] == "shared"
    monkeypatch.setattr(_doctor, "in_container", lambda: False)
    assert _doctor.ledger_sharing(tmp_path)["verdict"] == "host"


def test_mount_lookup_finds_the_longest_mount_point():
    found = _doctor._mount_of(Path("/proc/self"))
    assert found is not None and found["point"] == "/proc" and found["fstype"] == "proc"
