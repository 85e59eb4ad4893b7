"""`memgov profiles` tells apart the jobs of one label (one script, other arguments): each shows
the command its runs were recorded with."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.helpers.procs import run_memgov

JOB = Path(__file__).resolve().parents[1] / "profiles" / "job.py"


def memgov(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return run_memgov(*argv, env=env, timeout=60)


def test_jobs_of_one_label_are_told_apart_by_their_command(env):
    for mib in ("10", "20"):  # one script, two jobs (their arguments differ)
        ran = subprocess.run(
            [sys.executable, str(JOB), mib, "--size", "1GiB"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert ran.returncode == 0, ran.stderr
    rows = json.loads(memgov(env, "profiles", "--json").stdout)["profiles"]
    assert [r["label"] for r in rows] == ["job.py", "job.py"]
    commands = {r["job"]: r["command"] for r in rows}
    assert sorted(c.split()[-3] for c in commands.values()) == ["10", "20"], commands
    listing = memgov(env, "profiles").stdout.splitlines()
    for job, command in commands.items():
        at = next(i for i, line in enumerate(listing) if line.startswith(f"{job}  "))
        assert listing[at + 1] == f"  command: {command}"
        shown = memgov(env, "profiles", "show", job).stdout.splitlines()
        assert shown[1] == f"  command: {command}"
