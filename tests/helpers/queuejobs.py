"""Helpers of the queue's tests (tests/queue): jobs, queue files, the CLI, report checks."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.helpers.procs import run_memgov

GIB = 2**30
ROOT = Path(__file__).resolve().parents[2]


def sleeper(seconds: float, mark: Path | None = None, name: str = "") -> list[str]:
    """A job that appends its name to ``mark`` when it starts, then sleeps."""
    code = "import sys, time\n"
    if mark is not None:
        code += f"open({str(mark)!r}, 'a').write({name!r} + '\\n')\n"
    code += f"time.sleep({seconds})\n"
    return [sys.executable, "-c", code]


def write_queue(path: Path, jobs: list[dict[str, Any]], policy: str | None = None) -> Path:
    """A queue file (TOML) of ``jobs`` (JSON-compatible values are valid TOML inline values)."""
    lines = [f"[queue]\npolicy = {json.dumps(policy)}\n"] if policy else []
    for job in jobs:
        lines.append("[[job]]")
        for key, value in job.items():
            if isinstance(value, dict):
                inner = ", ".join(f"{k} = {json.dumps(v)}" for k, v in value.items())
                lines.append(f"{key} = {{ {inner} }}")
            else:
                lines.append(f"{key} = {json.dumps(value)}")
        lines.append("")
    path.write_text("\n".join(lines))
    return path


def memgov_cli(*args: str, timeout: float = 120, **kw: Any) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **kw.pop("env", {}), "PYTHONPATH": str(ROOT)}
    return run_memgov(*args, env=env, timeout=timeout, **kw)


def lines(path: Path) -> list[str]:
    """The words of a mark file (a sleeper's names), none before it exists."""
    return path.read_text().split() if path.exists() else []


def wait_for(check: Callable[[], object], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def cli_proc(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """``memgov ARGS`` started in its own session (a test signals its group), stdin closed."""
    return subprocess.Popen(
        [sys.executable, "-m", "memgov", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        start_new_session=True,
    )


def intervals(report: dict[str, Any]) -> list[tuple[int, float, float, int, str]]:
    """(gpu, start, end, claim, kind) of every job of a report."""
    return [
        (j["gpu"], j["start_s"], j["end_s"], j["claim_bytes"], j["kind"]) for j in report["jobs"]
    ]


def peak_claims(report: dict[str, Any]) -> dict[int, int]:
    """Per GPU, the most the queue's running jobs claimed at once."""
    peaks: dict[int, int] = {}
    spans = intervals(report)
    for gpu, start, _end, _claim, _kind in spans:
        at = sum(c for g, s, e, c, _k in spans if g == gpu and s <= start < e)
        peaks[gpu] = max(peaks.get(gpu, 0), at)
    return peaks


def overlapping(report: dict[str, Any], gpu: int) -> bool:
    spans = sorted((s, e) for g, s, e, _c, _k in intervals(report) if g == gpu)
    return any(b[0] < a[1] for a, b in itertools.pairwise(spans))
