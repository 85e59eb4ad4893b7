"""The exporter beside real users of one host (created as tests/hostile makes them: root, useradd;
``--host-changes``): root's exporter writes nowhere a user's symlink leads, and shows every
user's queue and waiting claims only from files that are that user's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hostile.conftest import User, base, shared, users  # noqa: F401  (fixtures)

pytestmark = [
    pytest.mark.host_changes("creates users mgl_a and mgl_b (useradd), removed after"),
    pytest.mark.skipif(os.geteuid() != 0, reason="creates users: needs root"),
]


def _memgov(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "memgov", *args], capture_output=True, text=True, timeout=120
    )


def test_textfile_never_follows_a_users_symlink_higher_up_its_path(
    users: dict[str, User],  # noqa: F811
    base: Path,  # noqa: F811
) -> None:
    a = users["mgl_a"]
    # A folder only root may enter, with a textfile folder of root's inside it.
    secret = base / "root-only"
    (secret / "textfile").mkdir(parents=True)
    secret.chmod(0o700)
    # mgl_a's own folder on the way, where mgl_a points a link at root's folder.
    mine = base / "mine"
    mine.mkdir()
    os.chown(mine, a.uid, a.uid)
    linked = a.run(f"import os; os.symlink({str(secret)!r}, {str(mine / 'up')!r}); out('linked')")
    assert linked == "linked"
    done = _memgov("exporter", "--textfile", str(mine / "up" / "textfile"), "--once")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "a symlink or not a folder" in done.stderr and str(mine / "up") in done.stderr
    assert list((secret / "textfile").iterdir()) == []  # nothing written where the link led
    # The same folder reached through real folders only is written.
    real = _memgov("exporter", "--textfile", str(secret / "textfile"), "--once")
    assert real.returncode == 0, real.stderr
    assert (secret / "textfile" / "memgov.prom").is_file()
