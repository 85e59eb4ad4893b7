"""Hard or soft: the mode a claim gets, why, and what hard mode sets in the environment.

This machine has no GPU and no MPS daemon, so every claim here is soft; what makes a claim hard
is checked as the decision function's answer for a real (non-simulated) device description, and
through what apply() writes into the environment (exactly what claim() does in hard mode).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import memgov
from memgov._gpu import enforce as _enforce, mpsctl as _mpsctl
from memgov._gpu.devices import Device
from memgov._ledger.ledger import DeviceLedger

MIB = 2**20
GPU = Device(0, "GPU-00000000-1111-2222-3333-444444444444", "real GPU", 80 * 2**30, 0, False, 0)
MPS_VARS = (
    "CUDA_MPS_PIPE_DIRECTORY",
    "CUDA_MPS_LOG_DIRECTORY",
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
    "MEMGOV_MPS_LIMIT",
    "MEMGOV_MPS",
    "MEMGOV_MPS_CLIENTS",
)


@pytest.fixture(autouse=True)
def no_mps_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in MPS_VARS:
        monkeypatch.delenv(name, raising=False)


def test_claim_on_simulated_device_is_soft_and_says_why(sim: str) -> None:
    claim = memgov.claim("1GiB", name="job")
    assert claim.mode == "soft"
    assert "simulated device" in claim.mode_reason
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in os.environ
    assert "mps" not in claim.reports
    out = subprocess.run(
        [sys.executable, "-m", "memgov.cli", "status", "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    (entry,) = json.loads(out.stdout)["devices"][0]["claims"]
    assert (entry["name"], entry["mode"]) == ("job", "soft")
    (record,) = DeviceLedger(claim_device()).snapshot().claims
    assert record.extra["mode_reason"] == claim.mode_reason


def claim_device() -> Device:
    return memgov.devices()[0]


@pytest.mark.parametrize("bad", [0, 101, -5, 2.5, True, "25", [25]])
def test_compute_outside_1_to_100_is_refused_before_anything_is_recorded(
    sim: str, bad: object
) -> None:
    with pytest.raises(ValueError, match=r"compute=.*accepted None .* from 1 to 100"):
        memgov.claim("1GiB", compute=bad)  # type: ignore[arg-type]
    assert DeviceLedger(claim_device()).snapshot().claims == []


def test_compute_is_recorded_and_reported_as_not_applied_when_soft(sim: str) -> None:
    claim = memgov.claim("1GiB", compute=25)
    assert claim.compute == 25
    assert "compute=25% not applied" in claim.mode_reason
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in os.environ
    (record,) = DeviceLedger(claim_device()).snapshot().claims
    assert record.extra["compute"] == 25


def test_cuda_already_initialised_makes_a_real_gpu_claim_soft() -> None:
    plan = _enforce.decide([GPU], cuda_initialized=True)
    assert not plan.hard
    assert plan.mode(GPU) == ("soft", plan.reason)
    assert "CUDA already initialised in this process" in plan.reason


def test_without_the_control_program_a_real_gpu_claim_is_soft(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Even with a control endpoint in memgov's pipe folder: nothing can check who is behind it.
    pipe = _mpsctl.paths().pipe
    pipe.mkdir(parents=True)
    os.mkfifo(pipe / "control")
    monkeypatch.setenv("PATH", str(tmp_path))
    plan = _enforce.decide([GPU], cuda_initialized=False)
    assert not plan.hard
    assert "nvidia-cuda-mps-control is not on PATH" in plan.reason
    assert _mpsctl.client_pipe() == (None, False)


def test_opt_out_and_foreign_limits_keep_claims_soft(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMGOV_MPS", "off")
    assert _enforce.decide([GPU], cuda_initialized=False).reason == "MEMGOV_MPS=off"
    monkeypatch.setenv("MEMGOV_MPS", "sometimes")
    with pytest.raises(ValueError, match=r"accepted auto .* or off"):
        _enforce.decide([GPU], cuda_initialized=False)
    monkeypatch.delenv("MEMGOV_MPS")
    # A limit a scheduler set is never replaced; one memgov set in a parent may be.
    monkeypatch.setenv("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=4G")
    plan = _enforce.decide([GPU], cuda_initialized=False)
    assert "was set outside memgov" in plan.reason
    monkeypatch.setenv("MEMGOV_MPS_LIMIT", "0=4G")
    plan = _enforce.decide([GPU], cuda_initialized=False)
    assert "outside memgov" not in plan.reason and not plan.hard  # on to the daemon checks


def test_pinned_limit_is_whole_mib_rounded_down() -> None:
    assert _enforce.pinned_limit(2**30, 0) == "0=1024M"
    assert _enforce.pinned_limit(2**30 - 1, 0) == "0=1023M"  # never above the budget
    assert _enforce.pinned_limit(1536 * MIB + 5, 0) == "0=1536M"


def test_apply_sets_the_hard_limit_and_restore_undoes_it(
    private_ledger: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "50")
    pipe = _mpsctl.paths().pipe
    plan = _enforce.Plan(True, f"daemon on {pipe}", pipe, memgov_daemon=True)
    assert plan.mode(GPU, 25) == ("hard", plan.reason)
    previous = _enforce.apply(plan, 2**30, 0, 25)
    assert os.environ["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=1024M"
    assert os.environ["MEMGOV_MPS_LIMIT"] == "0=1024M"
    assert os.environ["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert os.environ["CUDA_MPS_PIPE_DIRECTORY"] == str(pipe)
    assert os.environ["CUDA_MPS_LOG_DIRECTORY"] == str(pipe.parent / "log")
    assert "0=1024M" in _enforce.describe()
    # A child that inherits memgov's limit may claim for itself (its own budget replaces it).
    assert "outside memgov" not in _enforce.decide([GPU], cuda_initialized=False).reason
    _enforce.restore(previous)
    assert os.environ["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    for name in (
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
        "MEMGOV_MPS_LIMIT",
        "CUDA_MPS_PIPE_DIRECTORY",
        "CUDA_MPS_LOG_DIRECTORY",
    ):
        assert name not in os.environ


@pytest.mark.parametrize(
    ("inherited", "old_index", "after"),
    [
        ("1=2G", 1, "0=2G"),  # the claimed GPU's entry follows it to ordinal 0
        ("0=1G,1=2048M", 1, "0=2048M"),  # other GPUs are hidden now: their entries go
        ("0=1G, 1 = 2G ,", 1, "0=2G"),
        ("0=1G", 1, None),  # nothing for the claimed GPU: no variable naming a hidden one
        ("0=4G", 0, "0=4G"),
        ("2G", 1, "2G"),  # unreadable ordinals: left as is (the scheduler readers report it)
    ],
)
def test_inherited_pinned_limit_follows_the_pinned_gpu(
    inherited: str, old_index: int, after: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", inherited)
    _enforce.renumber_pinned(old_index)
    assert os.environ.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT") == after
    assert "MEMGOV_MPS_LIMIT" not in os.environ  # a scheduler's limit stays a scheduler's


def test_memgov_limit_stays_memgovs_when_renumbered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "1=1024M")
    monkeypatch.setenv("MEMGOV_MPS_LIMIT", "1=1024M")
    _enforce.renumber_pinned(1)
    assert os.environ["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=1024M"
    assert os.environ["MEMGOV_MPS_LIMIT"] == "0=1024M"
    assert "outside memgov" not in _enforce.decide([GPU], cuda_initialized=False).reason
