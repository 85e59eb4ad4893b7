"""SIGTERM ends a test session as Ctrl-C does, with its teardown (tests/conftest.py): what its
fixtures made goes. A child the session forked still dies by the signal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tests.helpers.procs import PYTEST

ROOT = Path(__file__).resolve().parents[1]


def test_sigterm_runs_the_sessions_teardown(tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    (tmp_path / "test_sleepy.py").write_text(
        textwrap.dedent(f"""
        import time
        from pathlib import Path
        import pytest

        MARKS = Path({str(marks)!r})

        @pytest.fixture(scope="session")
        def engine():
            yield
            (MARKS / "torn-down").write_text("yes")

        def test_long(engine):
            (MARKS / "running").write_text("yes")
            time.sleep(60)
        """)
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PYTEST_ADDOPTS", None)
    proc = subprocess.Popen(
        [
            *PYTEST,
            "-p",
            "tests.conftest",
            "--rootdir",
            str(tmp_path),
            "-c",
            os.devnull,
            str(tmp_path / "test_sleepy.py"),
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 60
    while not (marks / "running").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(proc.communicate()[0].decode())
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=60)[0].decode()
    assert (marks / "torn-down").exists(), out
    assert proc.returncode == 2, out  # pytest's "interrupted"


def test_a_forked_child_of_the_session_still_dies_by_sigterm() -> None:
    code = textwrap.dedent("""
        import os, signal, sys, time
        from tests import conftest
        conftest._terminate_like_interrupt()
        try:
            child = os.fork()
            if child == 0:
                try:
                    time.sleep(30)
                finally:
                    os._exit(0)  # reached only if the signal raised instead of killing
            time.sleep(0.3)
            os.kill(child, signal.SIGTERM)
            _, status = os.waitpid(child, 0)
            print("child", os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        except KeyboardInterrupt:
            print("session interrupted")
        """)
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.stdout.split("\n")[:2] == ["child True", "session interrupted"], done.stderr


def test_the_users_of_a_killed_session_are_known_and_no_others() -> None:
    """tests/hostile's users carry the pid of the session that made them: the next session
    removes those of a session that is gone, never a live one's, nor a user of the host's own
    that happens to share the name."""
    from tests.hostile.conftest import MADE_BY, made_by_a_session_that_is_gone

    gone = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1
    assert made_by_a_session_that_is_gone(f"{MADE_BY}{gone}")
    assert not made_by_a_session_that_is_gone(f"{MADE_BY}{os.getpid()}")
    assert not made_by_a_session_that_is_gone("")
    assert not made_by_a_session_that_is_gone("Alice,,,")
    assert not made_by_a_session_that_is_gone(f"{MADE_BY}12x")
