"""Helpers for auto-enable tests: real interpreters started with a private ledger and env."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

CLEARED_PREFIXES = (
    "MEMGOV_",
    "CUDA_DEVICE_MEMORY_LIMIT",
    "ALIYUN_COM_GPU_MEM",
    "GPU_MEMORY_LIMIT",
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
    "SLURM_SHARDS_ON_NODE",
    "XLA_",
    "TF_FORCE_GPU_ALLOW_GROWTH",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """A clean environment: private ledger, one simulated 16 GiB GPU, no memgov settings."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(CLEARED_PREFIXES)}
    clean.update(MEMGOV_DIR=str(tmp_path / "ledger"), MEMGOV_DEVICES="sim0:16GiB")
    clean["JAX_PLATFORMS"] = "cpu"
    clean["TF_CPP_MIN_LOG_LEVEL"] = "3"
    return clean


Run = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def py() -> Run:
    """Run ``python -c CODE`` (this venv's interpreter, so its memgov-autoenable.pth) with ENV."""

    def run(code: str, env: dict[str, str], timeout: float = 180) -> Any:
        return subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout
        )

    return run
