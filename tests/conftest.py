"""Fixtures shared by every test: a private ledger folder always, simulated GPUs on request."""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def private_ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own MEMGOV_DIR, so no test ever touches the host's real ledger."""
    path = tmp_path / "ledger"
    monkeypatch.setenv("MEMGOV_DIR", str(path))
    for name in ("MEMGOV_RESERVE", "MEMGOV_THREADS", "MEMGOV_HOLDER"):
        monkeypatch.delenv(name, raising=False)
    return path


@pytest.fixture
def sim(monkeypatch: pytest.MonkeyPatch) -> str:
    """One simulated 64 GiB GPU named sim0 (tests that need another layout set MEMGOV_DEVICES)."""
    monkeypatch.setenv("MEMGOV_DEVICES", "sim0:64GiB")
    return "sim0"


@pytest.fixture
def shared_ledger(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A ledger folder other users can reach (pytest's tmp_path is private: mode 0700)."""
    base = Path(tempfile.mkdtemp(prefix="memgov-test-", dir="/tmp"))
    base.chmod(0o1777)  # like /tmp: whoever claims first creates the ledger folder
    monkeypatch.setenv("MEMGOV_DIR", str(base / "ledger"))
    yield base / "ledger"
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(autouse=True)
def _release_claim_held_by_test() -> Iterator[None]:
    """A test that fails while holding an in-process claim must not leak it into the next test."""
    yield
    claim_module = sys.modules.get("memgov._claim")
    held = claim_module.current() if claim_module is not None else None
    if held is not None:
        held.release()

