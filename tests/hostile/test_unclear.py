"""A ledger claims cannot use is never shown as an empty one (docs/ledger.md,
"Set-ups"): `status`, `gc` and `doctor` say what is wrong and exit non-zero, for root and for a
user, without a traceback; settings that lead nowhere are refused saying what is accepted."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import User

RUN_CLI = (
    "import contextlib, io, sys\nimport memgov.cli\nerr = io.StringIO()\ncode = 0\n"
    "with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()) as o:\n"
    " try:\n  sys.argv = ['memgov', {command!r}]\n  memgov.cli.main()\n"
    " except SystemExit as e:\n  code = e.code or 0\n"
    "out([code, err.getvalue(), o.getvalue()])"
)


def as_user(user: User, command: str) -> tuple[int, str, str]:
    """`memgov COMMAND` run in-process as USER (its interpreter may be root's alone)."""
    code, err, out = user.run(RUN_CLI.format(command=command))
    return code, err, out


def broken(kind: str, base: Path, owner: int) -> Path:
    ledger = base / "ledger"
    if kind == "a file":
        ledger.write_text("x")
    elif kind == "unsearchable":
        ledger.mkdir(mode=0o700)  # root's, private: no one else can reach it
    elif kind == "another user's":
        ledger.mkdir(mode=0o755)
        os.chown(ledger, owner, owner)
    elif kind == "root's, not set up":
        ledger.mkdir(mode=0o755)  # no `sudo memgov gc`: no one else can make v1/
    return ledger


@pytest.mark.parametrize("kind", ["a file", "unsearchable", "another user's", "root's, not set up"])
def test_status_gc_and_doctor_say_what_is_wrong_with_an_unusable_ledger(
    users: dict[str, User], base: Path, kind: str
) -> None:
    a, b = users["mgl_a"], users["mgl_b"]
    ledger = broken(kind, base, b.uid)
    claim = a.run(
        "import memgov\ntry:\n memgov.claim('1GiB'); out('admitted')\n"
        "except memgov.MemgovError as e: out(str(e))"
    )
    assert claim != "admitted"
    for command in ("status", "gc", "doctor"):
        code, err, out = as_user(a, command)
        assert code != 0, (command, err, out)
        assert "Traceback" not in err + out and "(no claims)" not in out
        assert str(ledger) in err + out, (command, err, out)
    if kind == "a file":  # root is refused the same way
        for command in ("status", "gc", "doctor"):
            done = subprocess.run(
                [sys.executable, "-m", "memgov", command],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert done.returncode != 0 and "not a folder" in done.stderr + done.stdout


@pytest.mark.parametrize(
    ("variable", "value", "said"),
    [
        ("MEMGOV_DIR", "/proc/1/cwd", "/proc and /sys are the kernel's"),
        ("MEMGOV_DEVICES", "sim0:8EiB", "larger than any device"),
    ],
)
def test_settings_that_lead_nowhere_are_refused_saying_why(
    variable: str, value: str, said: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "memgov", "status"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "MEMGOV_DEVICES": "sim0:1GiB", variable: value},
    )
    assert done.returncode != 0 and said in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
