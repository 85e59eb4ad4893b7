"""benchmarks/gpu/scripts_checks.py's diagnosis, on this machine: where a job's time went, read
from its stamped log (start-up, steady rate, after training), and its exit probe in a real
interpreter (the numbers the GPU call reports must be right before device time is spent)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

GPU = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu"


@pytest.fixture(scope="module")
def checks() -> Iterator[ModuleType]:
    sys.path.insert(0, str(GPU))
    try:
        import scripts_checks

        yield scripts_checks
    finally:
        sys.path.remove(str(GPU))


def stamped(lines: list[tuple[float, str]]) -> str:
    return "".join(f"{t:8.3f} {text}\n" for t, text in lines)


def test_mnist_phases_from_its_progress_lines(checks: ModuleType) -> None:
    log = stamped(
        [
            (6.5, "memgov: claim 'main.py:1': 1.56 GiB on GPU-x (cuda:0, hard) [...]"),
            (20.0, "Train Epoch: 1 [0/60000 (0%)]\tLoss: 2.30"),
            (22.0, "Train Epoch: 1 [6400/60000 (11%)]\tLoss: 0.50"),
            (30.0, "Train Epoch: 1 [57600/60000 (96%)]\tLoss: 0.05"),
            (33.0, ""),
            (33.0, "Test set: Average loss: 0.05, Accuracy: 9800/10000 (98%)"),
        ]
    )
    got = checks.phases(checks.KINDS["mnist"], log, wall=34.5)
    assert got["start_s"] == 20.0 and got["progress_lines"] == 3
    assert got["rate"] == round((57600 - 6400) / 8.0, 1)  # past the first 100 steps
    assert got["after_s"] == 4.5 and got["exit_s"] == 1.5


def test_dcgan_rate_counts_the_epochs_after_the_first(checks: ModuleType) -> None:
    lines = [(5.0, "Namespace(dataset='fake', ...)")]
    t = 15.0
    for epoch in range(4):
        for step in range(16):
            lines.append((t, f"[{epoch}/4][{step}/16] Loss_D: 1.0 Loss_G: 2.0 D(x): 0.5"))
            t += 0.5 if epoch == 0 else 0.25
    got = checks.phases(checks.KINDS["dcgan"], stamped(lines), wall=t + 1)
    assert got["start_s"] == 15.0
    # From the first epoch's last step (its 1,000 images done, at 22.5 s) to the last step of
    # the fourth (34.75 s): 3,000 images.
    assert got["steady_s"] == 12.25
    assert got["rate"] == round(3000 / 12.25, 1)


def test_the_exit_probe_reports_torch_threads_and_keeps_a_shadowed_sitecustomize(
    checks: ModuleType,
    tmp_path: Path,
) -> None:
    shadowed = tmp_path / "theirs"
    shadowed.mkdir()
    (shadowed / "sitecustomize.py").write_text("import os\nos.environ['THEIRS_RAN'] = '1'\n")
    env = checks.probe_env(tmp_path, {**os.environ, "PYTHONPATH": str(shadowed)})
    code = "import os, torch; torch.set_num_threads(1); print(os.environ.get('THEIRS_RAN'))"
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1"
    probes = list((tmp_path / "probe-out").glob("*.json"))
    assert len(probes) == 1
    probe = json.loads(probes[0].read_text())
    assert probe["threads"] == 1 and probe["interop_threads"] >= 1


def test_a_mixed_run_governs_every_other_job_and_alternates_the_halves(
    checks: ModuleType,
) -> None:
    cond = checks.condition("mixed", "1600MiB", 143 * 2**30)
    base = {"MEMGOV_DIR": "/l"}
    first = checks._halves(cond, {"X": "1"}, base, 5)
    second = checks._halves(cond, {"X": "1"}, base, 5)
    swap = {"memgov": "hand", "hand": "memgov"}
    assert [g for g, _ in first] == [swap[g] for g, _ in second]
    assert [g for g, _ in first][:2] in (["memgov", "hand"], ["hand", "memgov"])
    for group, env in first + second:
        assert env["X"] == "1"
        if group == "memgov":
            assert env["MEMGOV_CLAIM"] == "1600MiB" and "OMP_NUM_THREADS" not in env
        else:  # hand-tuned, capped as memgov caps, on memgov's daemon
            assert "MEMGOV_CLAIM" not in env and env["OMP_NUM_THREADS"] == "1"
            assert env["PYTORCH_ALLOC_CONF"].startswith("per_process_memory_fraction:0.01")
            assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/l/mps/pipe"
    assert checks._halves(checks.condition("hand_mps", "1GiB", 2**40), {}, base, 5) == []


def test_an_unknown_condition_is_refused_with_the_accepted_names(checks: ModuleType) -> None:
    with pytest.raises(SystemExit) as refused:
        checks.condition("mixd", "1GiB", 2**40)
    message = str(refused.value)
    assert "'mixd'" in message
    assert all(name in message for name in ("mixed", "hand_mps_env", "memgov_mps_noruns"))


def test_the_hand_set_limits_are_the_values_memgov_sets(checks: ModuleType) -> None:
    """hand_mps_env is memgov's environment without memgov: its MPS limit and thread variables
    come from memgov's own definitions, and memgov stays off."""
    from memgov._cpu.threads import ENV_VARS
    from memgov._gpu.enforce import pinned_limit

    env = checks.condition("hand_mps_env", "1600MiB", 160 * 2**30)["env"]
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == pinned_limit(1600 * 2**20, 0) == "0=1600M"
    assert all(env[name] == "1" for name in ENV_VARS)
    assert env["MEMGOV_CLAIM"] == "off"
    assert env["PYTORCH_ALLOC_CONF"] == "per_process_memory_fraction:0.0098"
