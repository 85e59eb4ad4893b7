"""The queue's tests (no __init__.py here: a package named ``queue`` would hide the standard
library's): two simulated 16 GiB GPUs for every test, real child processes, a private ledger."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def two_gpus(monkeypatch: pytest.MonkeyPatch) -> str:
    spec = "sim0:16GiB,sim1:16GiB"
    monkeypatch.setenv("MEMGOV_DEVICES", spec)
    return spec
