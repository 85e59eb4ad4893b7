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
    # A container's own tmpfs (the whole file system mounted) against a host folder on a
    # tmpfs bound into it (the mount's root is that folder), as docs/ledger.md sets one up.
    monkeypatch.setattr(_doctor, "_mount_of", mount("/tmp", "tmpfs"))
    assert _doctor.ledger_sharing(tmp_path)["verdict"] == "private"
    monkeypatch.setattr(
        _doctor, "_mount_of", mount("/run/memgov-ledger", "tmpfs", "/memgov-ledger")
    )
    assert _doctor.ledger_sharing(tmp_path)["verdict"] == "shared"
    # A tmpfs of its own mounted whole at the ledger's own path (docs/ledger.md), bound in.
    monkeypatch.setattr(_doctor, "_mount_of", mount(str(tmp_path), "tmpfs"))
    assert _doctor.ledger_sharing(tmp_path)["verdict"] == "shared"
    monkeypatch.setattr(_doctor, "in_container", lambda: False)
    assert _doctor.ledger_sharing(tmp_path)["verdict"] == "host"


def test_a_shared_ledger_on_a_disk_file_system_is_flagged(monkeypatch, tmp_path: Path):
    """Another user's flood slows claims on a disk file system, not on a tmpfs (docs/ledger.md,
    "Floods"): doctor says so for a ledger every user writes (its v1/cpu/ open to all)."""
    cpu = tmp_path / "v1" / "cpu"
    cpu.mkdir(parents=True)
    monkeypatch.setattr(_doctor, "in_container", lambda: False)

    def on(fstype):
        monkeypatch.setattr(
            _doctor,
            "_mount_of",
            lambda path: {"point": "/", "root": "/", "fstype": fstype, "source": "x"},
        )
        return _doctor.ledger_sharing(tmp_path)

    cpu.chmod(0o755)  # one user's ledger: no one else writes it
    assert on("ext4")["flood_note"] is None
    cpu.chmod(0o1777)  # the shared set-up
    monkeypatch.setattr(_doctor, "in_container", lambda: True)
    assert on("overlay")["flood_note"] is None  # a container's own ledger: WARNING enough
    monkeypatch.setattr(_doctor, "in_container", lambda: False)
    assert "on a tmpfs of its own" in on("ext4")["flood_note"]
    assert on("ext4")["filesystem"] == "ext4"
    assert on("tmpfs")["flood_note"] is None


def test_mount_lookup_finds_the_longest_mount_point():
    found = _doctor._mount_of(Path("/proc/self"))
    assert found is not None and found["point"] == "/proc" and found["fstype"] == "proc"


GOVERNED_PARENT = """
import os, subprocess, sys
import memgov
memgov.claim("1GiB")  # sets the thread share and the adapters' variables, as auto-enable does
for args in (["--json"], []):
    done = subprocess.run([sys.executable, "-m", "memgov.cli", "doctor", *args],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    sys.stdout.write(done.stdout + "\\n@@\\n")
"""


def test_doctor_in_a_governed_child_tells_memgovs_variables_from_the_users(env, py):
    env["TF_FORCE_GPU_ALLOW_GROWTH"] = "false"  # the user's: memgov keeps it (setdefault)
    done = py(GOVERNED_PARENT, env)
    assert done.returncode == 0, done.stderr
    as_json, text, _ = done.stdout.split("\n@@\n")
    report = json.loads(as_json)
    ours = report["environment_set_by_memgov"]
    assert {"MEMGOV_HOLDER", "MEMGOV_THREADS_SET", "OMP_NUM_THREADS"} <= set(ours)
    assert ours["XLA_PYTHON_CLIENT_PREALLOCATE"] == {
        "value": "false",
        "why": "import memgov: no greedy preallocation (MEMGOV_ENV_SET)",
    }
    assert "MEMGOV_ENV_SET" in ours
    threads = ours["MEMGOV_THREADS_SET"]["value"]
    assert ours["OMP_NUM_THREADS"] == {
        "value": threads,
        "why": f"a governed process's CPU thread share (MEMGOV_THREADS_SET={threads})",
    }
    users = report["environment"]
    assert users["TF_FORCE_GPU_ALLOW_GROWTH"] == "false" and "OMP_NUM_THREADS" not in users
    assert set(users) & set(ours) == set()
    assert f"env OMP_NUM_THREADS={threads} (set by memgov: a governed process's" in text
    assert "env TF_FORCE_GPU_ALLOW_GROWTH=false\n" in text


def test_doctor_alone_does_not_count_its_own_import_as_the_users(env):
    """`import memgov` sets TF_FORCE_GPU_ALLOW_GROWTH and XLA_PYTHON_CLIENT_PREALLOCATE (where
    unset) in doctor's own process too: they are memgov's, not the user's."""
    report = json.loads(doctor(env, "--json").stdout)
    assert "TF_FORCE_GPU_ALLOW_GROWTH" not in report["environment"]
    assert set(report["environment_set_by_memgov"]) == {
        "MEMGOV_ENV_SET",
        "TF_FORCE_GPU_ALLOW_GROWTH",
        "XLA_PYTHON_CLIENT_PREALLOCATE",
    }


def test_a_thread_count_the_user_set_is_the_users(env, py):
    env["OMP_NUM_THREADS"] = "3"  # memgov then leaves thread pools alone
    done = py(GOVERNED_PARENT, env)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.split("\n@@\n")[0])
    assert report["environment"]["OMP_NUM_THREADS"] == "3"
    assert "OMP_NUM_THREADS" not in report["environment_set_by_memgov"]
