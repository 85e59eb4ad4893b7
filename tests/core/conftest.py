"""Fixtures of the core tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from helpers.procs import Child


@pytest.fixture
def children() -> Iterator[list[Child]]:
    """Child claimers a test starts (append them); each is closed when the test ends."""
    started: list[Child] = []
    yield started
    for child in started:
        child.close()
