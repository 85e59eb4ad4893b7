"""cuda:N everywhere a device is named (claim, MEMGOV_DEVICE, memgov run --gpu), and a device
that matches nothing refused up front by `memgov run` instead of a warning inside CMD."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import memgov

GIB = 2**30
MEMGOV = [sys.executable, "-m", "memgov"]
SHOW = "import memgov, json; c = memgov.current(); print(json.dumps(c and c.device))"


@pytest.fixture
def two(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMGOV_DEVICES", "sim0:16GiB,sim1:16GiB")


@pytest.mark.usefixtures("two")
def test_claim_on_cuda_1_goes_to_the_second_gpu() -> None:
    with memgov.claim("1GiB", device="cuda:1") as held:
        assert held.device == "sim1"


def test_memgov_device_cuda_1_is_governed(env, py):
    env.update(MEMGOV_DEVICES="sim0:16GiB,sim1:16GiB", MEMGOV_CLAIM="1GiB", MEMGOV_DEVICE="cuda:1")
    result = py("import torch\n" + SHOW, env)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == "sim1"
    assert "warning" not in result.stderr


@pytest.mark.parametrize("option", ["--gpu", "--device"])
def test_memgov_run_gpu_cuda_1(env, option):
    """One name for the GPU in every command (--gpu, as pack and queue add); --device, the old
    spelling of memgov run, still works for a release and says so in one line."""
    env["MEMGOV_DEVICES"] = "sim0:16GiB,sim1:16GiB"
    result = subprocess.run(
        [*MEMGOV, "run", "--claim", "1GiB", option, "cuda:1", "--",
         sys.executable, "-c", "import torch\n" + SHOW],
        env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == "sim1"
    assert "warning" not in result.stderr
    assert ("memgov: --device is now --gpu" in result.stderr) == (option == "--device")


@pytest.mark.parametrize(
    ("device", "text"),
    [
        ("banana", "--gpu 'banana': device='banana' matches no visible GPU (visible: sim0)"),
        ("cuda:3", "this process sees 1 GPU(s), indices 0..0"),
        ("", "accepted None (the first visible GPU)"),
    ],
)
def test_memgov_run_refuses_a_device_that_matches_nothing(env, tmp_path, device, text):
    result = subprocess.run(
        [*MEMGOV, "run", "--claim", "1GiB", "--gpu", device, "--", "touch", "ran"],
        env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 2
    assert text in result.stderr
    assert not (tmp_path / "ran").exists()  # CMD never started
