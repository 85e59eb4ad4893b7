"""The GPU benchmark scripts refuse malformed options before any work (they run unattended on the
GPU machine, where a traceback half-way through a call costs device time)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

GPU = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu"


@pytest.mark.parametrize(
    ("script", "args", "says"),
    [
        ("threads_checks.py", ["torch", "--variant", "graph"], "accepted NAME=TRAINER_ARGS"),
        ("threads_checks.py", ["torch", "--variant", "a b=--x"], "accepted NAME=TRAINER_ARGS"),
        ("threads_checks.py", ["torch", "--variant", "q=--x 'open"], "trainer arguments"),
        ("threads_checks.py", ["torch", "--repeat", "0"], "--repeat 0: accepted a whole number"),
        ("scripts_checks.py", ["--startup-samples", "0"], "accepted milliseconds above 0"),
        ("scripts_checks.py", ["--startup-samples", "-5"], "accepted milliseconds above 0"),
        ("mps_limit_cost.py", ["--n", "0"], "--n 0: accepted a whole number >= 1"),
        ("mps_limit_cost.py", ["--steps", "100", "--warm", "300"], "above --warm (300)"),
        (
            "torch_step_profile.py",
            ["--out", "/dev/null", "--variant", "=--x"],
            "accepted NAME=TRAINER_ARGS",
        ),
    ],
)
def test_bad_options_are_refused_with_what_is_accepted(
    script: str, args: list[str], says: str, tmp_path: Path
) -> None:
    done = subprocess.run(
        [sys.executable, str(GPU / script), *args, "--out", str(tmp_path)]
        if script != "torch_step_profile.py"
        else [sys.executable, str(GPU / script), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert says in done.stderr
    assert not any(tmp_path.iterdir())  # nothing run, nothing written
