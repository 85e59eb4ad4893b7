"""The host-changes gate (tests/helpers/host_changes.py, tests/conftest.py): tests marked
host_changes, or using a fixture registered as changing the host, skip by default saying what they
would do and how to ask; --host-changes or MEMGOV_TEST_HOST_CHANGES=1 runs them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

SAMPLE = """
import pytest
from tests.helpers.host_changes import changes_host


@pytest.fixture
@changes_host("makes the thing")
def thing():
    return 1


@pytest.fixture
def uses_thing(thing):
    return thing


def test_through_a_fixture(uses_thing):
    pass


@pytest.mark.host_changes("adds a user")
def test_marked():
    pass


def test_plain():
    pass
"""


def _pytest(
    folder: Path, *args: str, setting: str | None = None
) -> subprocess.CompletedProcess[str]:
    """pytest on FOLDER's sample with this suite's conftest loaded as a plugin."""
    (folder / "test_sample.py").write_text(SAMPLE)
    env = {k: v for k, v in os.environ.items() if k != "MEMGOV_TEST_HOST_CHANGES"}
    # TESTS for `-p conftest`, its parent for what conftest imports (tests.helpers).
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), str(TESTS.parent), env.get("PYTHONPATH", "")])
    if setting is not None:
        env["MEMGOV_TEST_HOST_CHANGES"] = setting
    argv = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "conftest",
        "-p",
        "no:cacheprovider",
        "-q",
        "-rs",
        "-W",
        "ignore::pytest.PytestUnknownMarkWarning",
        *args,
        str(folder),
    ]
    return subprocess.run(argv, cwd=folder, env=env, capture_output=True, text=True, timeout=120)


def test_by_default_they_skip_saying_what_they_would_do_and_how_to_ask(tmp_path: Path) -> None:
    done = _pytest(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed, 2 skipped" in done.stdout, done.stdout
    how = "changes the host; run with --host-changes (or MEMGOV_TEST_HOST_CHANGES=1) to allow it"
    assert f"{how}: makes the thing" in done.stdout, done.stdout
    assert f"{how}: adds a user" in done.stdout, done.stdout


def test_the_option_or_the_variable_runs_them(tmp_path: Path) -> None:
    for args, setting in ((["--host-changes"], None), ([], "1")):
        done = _pytest(tmp_path, *args, setting=setting)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "3 passed" in done.stdout and "skipped" not in done.stdout, done.stdout


def test_they_can_be_selected_by_their_marker(tmp_path: Path) -> None:
    done = _pytest(tmp_path, "--host-changes", "-m", "host_changes")
    assert "2 passed, 1 deselected" in done.stdout, done.stdout


def test_a_bad_value_is_refused_saying_what_is_accepted(tmp_path: Path) -> None:
    done = _pytest(tmp_path, setting="yes")
    assert done.returncode == 4, done.stdout + done.stderr
    assert "MEMGOV_TEST_HOST_CHANGES='yes': accepted are 1" in done.stderr, done.stderr
    assert _pytest(tmp_path, setting="0").returncode == 0
