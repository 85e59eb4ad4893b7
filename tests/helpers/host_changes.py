"""Tests that change the host run only when asked: ``pytest --host-changes`` (or
MEMGOV_TEST_HOST_CHANGES=1). Changing the host means installing packages (apt-get, pip outside a
temporary venv), creating users, starting engines or servers (dockerd), or keeping images.

A test says so with ``@pytest.mark.host_changes("what it does")``; a fixture that does it is
registered with ``@changes_host("what it does")`` (below ``@pytest.fixture``), and every test that
uses it, directly or through other fixtures, gets the marker (tests/conftest.py). Without the
option such tests are skipped, and the skip says what they would do and how to ask for them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

import pytest

OPTION = "--host-changes"
SETTING = "MEMGOV_TEST_HOST_CHANGES"
MARKER = "host_changes"

FIXTURES: dict[str, str] = {}
"""Fixture name -> what it does to the host (registered by changes_host)."""

F = TypeVar("F", bound=Callable[..., object])


SESSION_PID = os.getpid()
"""This test session's pid: what a fixture that changes the host names its engines, folders and
users with, so that a later session knows them as this one's once it is gone (killed before its
teardown) and removes them (tests/docker/leftovers.py, tests/hostile/conftest.py)."""


def session_gone(pid: int) -> bool:
    """Whether the session of that pid no longer runs (another user's process counts as running:
    what is not known to be gone is never removed)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


def changes_host(what: str) -> Callable[[F], F]:
    """Register the fixture function below it as one doing ``what`` to the host."""

    def register(fixture: F) -> F:
        FIXTURES[getattr(fixture, "__name__", "")] = what
        return fixture

    return register


def allowed(config: pytest.Config) -> bool:
    """Whether this run may change the host: the option, or the variable set to 1."""
    if config.getoption(OPTION):
        return True
    value = os.environ.get(SETTING, "").strip()
    if value in ("", "0"):
        return False
    if value == "1":
        return True
    raise pytest.UsageError(
        f"{SETTING}={value!r}: accepted are 1 (run the tests that change the "
        "host) and 0 or unset (skip them)"
    )


def skip_reason(what: str) -> str:
    return f"changes the host; run with {OPTION} (or {SETTING}=1) to allow it: {what}"


def what_it_does(item: pytest.Item) -> str | None:
    """What ITEM would do to the host: its marker's text, else that of a fixture it uses."""
    marker = item.get_closest_marker(MARKER)
    if marker is not None:
        return str(marker.args[0]) if marker.args else "changes the host"
    used = getattr(item, "fixturenames", ())
    found = [FIXTURES[name] for name in used if name in FIXTURES]
    return "; ".join(dict.fromkeys(found)) if found else None
