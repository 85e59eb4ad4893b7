"""A claim larger than the device, on every path that takes one: memgov run, memgov pack,
auto-enable, memgov.claim() and Ray's requests. Each is checked where every size meets a device
(memgov/_gpu/devices.py, sizes_on; memgov/_base/sizes.py, Size.on): refused before anything starts,
in one line naming the device's size and what is accepted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psutil
import pytest

import memgov
from memgov._base.errors import ConfigError
from memgov._base.sizes import format_size
from memgov.ray._request import build

from .test_forked_children import not_pythons

MEMGOV = [sys.executable, "-m", "memgov.cli"]
MNIST = Path(__file__).resolve().parents[2] / "experiments" / "mnist"
ACCEPTED = "accepted at most 16.00 GiB or a percentage of the device sim0"


def memgov_cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*MEMGOV, *args], env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("size", ["999TiB", "17GiB", str(16 * 2**30 + 1)])
def test_run_refuses_before_cmd_starts(env: dict[str, str], tmp_path: Path, size: str) -> None:
    marker = tmp_path / "ran"
    result = memgov_cli(["run", "--claim", size, "--", "touch", str(marker)], env)
    assert result.returncode == 2, result.stderr
    assert not marker.exists()  # CMD never started
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"memgov: --claim: '{size}' (")
    assert f"is larger than the device sim0 (16.00 GiB); {ACCEPTED}" in lines[0]


def test_run_still_starts_cmd_with_a_claim_that_fits(env: dict[str, str], tmp_path: Path) -> None:
    for size in ("16GiB", "100%", "1GiB"):
        marker = tmp_path / f"ran-{size}"
        result = memgov_cli(["run", "--claim", size, "--", "touch", str(marker)], env)
        assert result.returncode == 0 and marker.exists(), result.stderr


def test_run_with_device_auto_names_the_largest_device(env: dict[str, str]) -> None:
    env["MEMGOV_DEVICES"] = "sim0:16GiB,sim1:32GiB"
    refused = memgov_cli(["run", "--claim", "33GiB", "--gpu", "auto", "--", "true"], env)
    assert refused.returncode == 2
    assert "larger than the largest device, sim1 (32.00 GiB)" in refused.stderr
    fits_one = memgov_cli(["run", "--claim", "20GiB", "--gpu", "auto", "--", "true"], env)
    assert fits_one.returncode == 0, fits_one.stderr  # sim1 can hold it: auto picks it later


def test_pack_refuses_before_any_job(env: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "report"
    args = ["pack", str(MNIST), "--device", "cpu", "--n", "2", "--out", str(out)]
    env.pop("MEMGOV_DEVICES")  # pack's own simulated GPU: it stands for this host's memory
    own = memgov_cli([*args, "--claim", "999TiB"], env)
    host = format_size(psutil.virtual_memory().total)
    assert own.returncode == 2, own.stderr
    assert len(own.stderr.splitlines()) == 1, own.stderr
    assert f"'999TiB' (1022976.00 GiB) is larger than this host's memory ({host})" in own.stderr
    env["MEMGOV_DEVICES"] = "sim0:16GiB"  # the user's simulated GPU
    user = memgov_cli([*args, "--claim", "17GiB"], env)
    assert user.returncode == 2, user.stderr
    assert len(user.stderr.splitlines()) == 1, user.stderr
    assert f"is larger than the device sim0 (16.00 GiB); {ACCEPTED}" in user.stderr
    assert not out.exists()  # no job ran, no report was written


def test_auto_enable_says_once_that_the_claim_cannot_be_granted(env: dict[str, str], py) -> None:
    env["MEMGOV_CLAIM"] = "999TiB"
    result = py("import torch\nprint('ran')", env)
    assert result.returncode == 0 and result.stdout.strip() == "ran", result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr  # one warning, the program runs on
    assert lines[0].startswith("memgov: warning: MEMGOV_CLAIM: '999TiB' (1022976.00 GiB) is ")
    assert f"larger than the device sim0 (16.00 GiB); {ACCEPTED}" in lines[0]
    env["MEMGOV_STRICT"] = "1"
    strict = py("import torch", env)
    assert strict.returncode == 1
    assert "ConfigError: MEMGOV_CLAIM: '999TiB'" in strict.stderr
    assert "Traceback" in strict.stderr  # raised from the import statement, as strict promises


def test_spawned_workers_of_the_program_do_not_say_it_again(
    env: dict[str, str], tmp_path: Path
) -> None:
    env.update(MEMGOV_CLAIM="999TiB", HANG_MARKS=str(tmp_path / "marks"))
    program = Path(__file__).resolve().parent / "forked_children.py"
    result = subprocess.run(
        [sys.executable, str(program), "dataloader", "spawn"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = not_pythons(result.stderr)
    assert len(lines) == 1 and "larger than the device sim0" in lines[0], result.stderr


def test_a_subprocess_stays_quiet_but_memgov_run_says_its_own(env: dict[str, str], py) -> None:
    env.update(MEMGOV_CLAIM="1GiB", MEMGOV_THREADS="many")  # auto-enable fails on a setting
    code = (
        "import subprocess, sys, torch\n"
        "subprocess.run([sys.executable, '-c', 'import torch'], check=True)\n"
        "subprocess.run([sys.executable, '-m', 'memgov.cli', 'run', '--', sys.executable, '-c',"
        " 'import torch'], check=True)\n"
    )
    result = py(code, env)
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 2, result.stderr  # the program's, then memgov run's CMD's; not the child's
    assert all(line.startswith("memgov: warning: MEMGOV_THREADS='many'") for line in lines)


def test_claim_raises_a_memgov_error_and_holds_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMGOV_DEVICES", "sim0:16GiB")
    with pytest.raises(ConfigError) as info:
        memgov.claim("999TiB")
    assert str(info.value) == (
        "claim size: '999TiB' (1022976.00 GiB) is larger than the device sim0 (16.00 GiB); "
        + ACCEPTED
        + "; or 'auto' (a GPU scheduler's budget, else the job's measured profile, else a "
        "first-run share of what is free; docs/profiles.md)"
    )
    assert memgov.current() is None
    with memgov.claim("16GiB") as held:  # the whole device was never taken
        assert held.bytes == 16 * 2**30


def test_ray_requests_are_checked_the_same_way() -> None:
    with pytest.raises(ConfigError) as info:
        build("999TiB", "16GiB", None, None)
    assert str(info.value).startswith(
        "budget: '999TiB' (1022976.00 GiB) is larger than GPUs of 16384 MiB (16.00 GiB); "
        "accepted at most 16.00 GiB"
    )
    assert "it can never fit: a budget lives on one GPU" in str(info.value)
    assert build("16GiB", "16GiB", None, None).budget == 16 * 2**30
