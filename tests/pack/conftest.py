"""Pack tests run real `memgov pack` processes with tiny CPU jobs of experiments/mnist."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def data_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mnist-cache")


@pytest.fixture(autouse=True)
def _pack_env(monkeypatch: pytest.MonkeyPatch, data_cache: Path) -> None:
    # One MNIST extraction for the whole session; no simulated GPUs unless a test sets them.
    monkeypatch.setenv("MEMGOV_DATA_CACHE", str(data_cache))
    for name in ("MEMGOV_DEVICES", "MEMGOV_CLAIM", "MEMGOV_MPS_CLIENTS"):
        monkeypatch.delenv(name, raising=False)
