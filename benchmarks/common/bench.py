"""What benchmark scripts share besides NVML sampling: the report's head, worker processes, the
printed figures, option parsing. Import with ``sys.path.insert(0, str(BENCHMARKS / "common"))``
then ``from bench import ...`` (a worker started as ``python SCRIPT --worker`` imports it too).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any


# -- the report -----------------------------------------------------------------------------------
def machine(**extra: Any) -> dict[str, Any]:
    """Where a benchmark ran, and how busy the machine was at its start (``extra``: more fields);
    :func:`ended` adds the load at its end."""
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parent,
    ).stdout.strip()
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "git_commit": commit or None,
        **extra,
        "loadavg_1_5_15_at_start": os.getloadavg(),
    }


def report_head(benchmark: str, **extra: Any) -> dict[str, Any]:
    """A JSON report's first fields: which benchmark, the command, when, and :func:`machine`."""
    return {
        "benchmark": benchmark,
        "command": " ".join(["python", *sys.argv]),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine(**extra),
    }


def ended(report: dict[str, Any]) -> None:
    """Record the load at the end: other work on the machine inflates the tail."""
    report["machine"]["loadavg_1_5_15_at_end"] = os.getloadavg()


def down(value: float, digits: int = 2) -> str:
    """``value`` truncated, never rounded up, for the printed table (the JSON keeps every digit)."""
    return f"{math.floor(value * 10**digits) / 10**digits:.{digits}f}"


def nearest_rank(values: Iterable[float], pct: float) -> float:
    """The nearest-rank percentile ``pct`` (0-100) of ``values`` (not empty)."""
    ordered = sorted(values)
    return ordered[max(1, math.ceil(pct / 100 * len(ordered))) - 1]


def summed_profiles(files: list[Path], what: str, top: int = 60, only: str = "") -> str:
    """cProfile files of several processes summed: their count (``what`` names them), then the
    ``top`` functions by cumulative time and by own time (``only``: those whose file and name
    match this regular expression). A torn file (a process killed while it dumped its profile)
    is left out."""
    import io
    import pstats

    readable = []
    for path in files:
        try:
            pstats.Stats(str(path), stream=io.StringIO())
        except (EOFError, ValueError, TypeError):
            continue
        readable.append(str(path))
    if not readable:
        return ""
    out = io.StringIO()
    stats = pstats.Stats(readable[0], stream=out)
    for name in readable[1:]:
        stats.add(name)
    out.write(f"{len(readable)} {what}\n")
    keep = [only] if only else []
    stats.sort_stats("cumulative").print_stats(*keep, top)
    stats.sort_stats("tottime").print_stats(*keep, top * 2 // 3)
    return out.getvalue()


# -- worker processes -----------------------------------------------------------------------------
def ledger_env(ledger: Path, devices: str) -> dict[str, str]:
    """This environment for workers on a ledger of their own (``devices``: MEMGOV_DEVICES),
    holding no claim of this process's."""
    env = dict(os.environ)
    env.pop("MEMGOV_HOLDER", None)
    env.update(MEMGOV_DIR=str(ledger), MEMGOV_DEVICES=devices)
    return env


def start_workers(
    commands: Iterable[list[str]], env: dict[str, str]
) -> list[subprocess.Popen[str]]:
    """Start one worker per command and wait until each says ``ready`` (a barrier: the workers
    start their work together at :func:`release_workers`)."""
    procs = [
        subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        for command in commands
    ]
    for proc in procs:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        if line != "ready":
            raise SystemExit(f"worker {proc.pid} failed to start: {line!r}")
    return procs


def release_workers(procs: list[subprocess.Popen[str]]) -> None:
    """Tell every ready worker to go."""
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()


def worker_results(procs: list[subprocess.Popen[str]], timeout: float) -> list[Any]:
    """Each worker's one JSON output, once it exits; a worker that failed ends the benchmark."""
    results = []
    for proc in procs:
        out, _ = proc.communicate(timeout=timeout)
        if proc.returncode != 0:
            raise SystemExit(f"worker {proc.pid} exited with {proc.returncode}")
        results.append(json.loads(out))
    return results


def kill_groups(
    procs: Iterable[subprocess.Popen[Any]], readers: Iterable[threading.Thread]
) -> None:
    """End every job still running, with its process group (started with start_new_session),
    then let the threads reading their output finish."""
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    for reader in readers:
        reader.join(timeout=10)


# -- probes (source text a benchmark runs with python -c) -----------------------------------------
THREAD_TICKS = """
import os
def ticks():
    \"\"\"CPU ticks (utime + stime) of each thread of this process so far, by thread id.\"\"\"
    found = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        found[tid] = int(fields[11]) + int(fields[12])
    return found
def busy(before):
    \"\"\"Threads that did at least 10 % of the work since ``before`` (ticks()): unlike CPU
    time / wall time, this count does not change when other load shares the cores.\"\"\"
    used = {t: n - before.get(t, 0) for t, n in ticks().items()}
    total = sum(used.values()) or 1
    return sum(1 for n in used.values() if n >= 0.1 * total)
"""
"""Defines ticks() and busy(before) in a probe: which threads of a process do its work."""


# -- options --------------------------------------------------------------------------------------
def variant(text: str) -> tuple[str, str]:
    """NAME=ARGS (trainer flags, may be empty), as --variant takes it."""
    name, sep, flags = text.partition("=")
    if not sep or not name.strip() or not name.replace("-", "_").isidentifier():
        raise argparse.ArgumentTypeError(
            f"{text!r}: accepted NAME=TRAINER_ARGS, NAME letters, digits, - or _ "
            "(e.g. 'graph=--cuda-graph' or 'default=')"
        )
    try:
        shlex.split(flags)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: trainer arguments {exc}") from None
    return name, flags
