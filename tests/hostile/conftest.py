"""The hostile suite: real users of one host (created here, as root) against each other.

Users mgl_a, mgl_b and mgl_c are made for the session and removed after it (only those this
run made): a change to the host, so the tests using them run only with ``pytest --host-changes``.
Each test gets a fresh ledger under a sticky world-writable base folder, like /tmp.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.host_changes import SESSION_PID, changes_host, session_gone

ACTOR = Path(__file__).resolve().parent / "actor.py"
NAMES = ("mgl_a", "mgl_b", "mgl_c")

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="creates users: needs root")


@dataclass(frozen=True)
class User:
    name: str
    uid: int

    def run(self, code: str, env: dict[str, str] | None = None, timeout: float = 60) -> Any:
        """Run CODE as this user (see actor.py); the last JSON line it printed."""
        result = subprocess.run(
            [sys.executable, str(ACTOR), str(self.uid), code],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, **(env or {})},
        )
        assert result.returncode == 0, result.stdout + result.stderr
        lines = [ln[2:] for ln in result.stdout.splitlines() if ln.startswith("@@")]
        return json.loads(lines[-1]) if lines else None


def start(user: User, code: str) -> subprocess.Popen[str]:
    """CODE as USER in the background; returns once it printed its first line ("{}")."""
    proc = subprocess.Popen(
        [sys.executable, str(ACTOR), str(user.uid), code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "{}", proc.stdout
    return proc


MADE_BY = "memgov tests, session "
"""The comment of each user a test session makes, with its pid: a session killed before its
teardown leaves its users, and the next one then knows them as a test's, not the host's."""


def made_by_a_session_that_is_gone(comment: str) -> bool:
    pid = comment.removeprefix(MADE_BY)
    return comment.startswith(MADE_BY) and pid.isdigit() and session_gone(int(pid))


@pytest.fixture(scope="session")
@changes_host("creates the users mgl_a, mgl_b and mgl_c with useradd, removed after the session")
def users() -> Iterator[dict[str, User]]:
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        pytest.skip("needs root and useradd to create users")
    made: list[str] = []
    found: dict[str, User] = {}
    try:  # an interrupt while the users are made still removes those made so far
        for name in NAMES:
            try:
                entry = pwd.getpwnam(name)
            except KeyError:
                made.append(name)  # first: an interrupt right after useradd still removes it
                try:
                    subprocess.run(
                        [
                            "useradd",
                            "--no-create-home",
                            "--user-group",
                            "--shell",
                            "/usr/sbin/nologin",
                            "--comment",
                            f"{MADE_BY}{SESSION_PID}",
                            name,
                        ],
                        check=True,
                        capture_output=True,
                    )
                except subprocess.CalledProcessError:
                    made.remove(name)  # not made here (another made it meanwhile): not ours
                    raise
            else:
                if made_by_a_session_that_is_gone(entry.pw_gecos):
                    made.append(name)  # a killed session's, never removed: this one removes it
            found[name] = User(name, pwd.getpwnam(name).pw_uid)
        yield found
    finally:
        for name in made:
            subprocess.run(["userdel", name], capture_output=True)


@pytest.fixture
def base(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder like /tmp (root's, 1777); MEMGOV_DIR is base/ledger, not made yet."""
    folder = Path(tempfile.mkdtemp(prefix="memgov-hostile-", dir="/tmp"))
    folder.chmod(0o1777)
    monkeypatch.setenv("MEMGOV_DIR", str(folder / "ledger"))
    monkeypatch.setenv("MEMGOV_DEVICES", "sim0:64GiB")
    yield folder
    _remove(folder)


REMOVE_WITHIN_S = 5.0
"""How long a test's folder may take to go: a governed process of the test may still be
writing its run's profile into it as the test ends."""


def _remove(folder: Path) -> None:
    """Remove a test's folder, retried while something still writes into it; what is still
    there after REMOVE_WITHIN_S fails the test by name (once, a CI run left an empty
    ``ledger/v1/_profiles/0`` in /tmp, unseen, because removal ignored every error)."""
    deadline = time.monotonic() + REMOVE_WITHIN_S
    while True:
        shutil.rmtree(folder, ignore_errors=True)
        if not os.path.lexists(folder) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    if os.path.lexists(folder):
        left = sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))
        pytest.fail(f"{folder} not removed within {REMOVE_WITHIN_S:g} s; left: {left[:20]}")


@pytest.fixture
def shared(base: Path) -> Path:
    """The documented admin set-up: root runs `memgov gc` once, which makes every folder."""
    result = subprocess.run(
        [sys.executable, "-m", "memgov", "gc"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return base / "ledger"
