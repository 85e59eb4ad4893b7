"""The test session survives TensorFlow and torch's triton in one process (tests/conftest.py
loads triton first where both are installed: tensorflow/tensorflow#124205)."""

from __future__ import annotations

import subprocess
from importlib.util import find_spec
from pathlib import Path

import pytest

from tests.helpers.procs import PYTEST

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(
    find_spec("triton") is None or find_spec("tensorflow") is None,
    reason="needs triton (torch's CUDA build brings it) and TensorFlow installed together",
)
def test_a_session_that_imports_tensorflow_then_triton_does_not_crash() -> None:
    """The TensorFlow adapter's tests import TensorFlow in the session; the torch trainer's then
    reach torch._dynamo, which imports triton: the interpreter segfaulted there (rc -11)."""
    done = subprocess.run(
        [
            *PYTEST,
            "tests/adapters/test_tensorflow_adapter.py",
            "tests/experiments/test_torch_trainer_metrics.py",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
