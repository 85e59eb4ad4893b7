"""The process that `memgov exporter` leaves serving: what it imports and how it is started.

`memgov exporter` replaces itself (same PID) with `python -m memgov.exporter` (docs/metrics.md,
"Memory"). These tests run the command as users do and look at that process from outside: its
imports, logged by the interpreter itself (``-X importtime``, which the command passes on to the
serving process as it passes every interpreter flag), and its environment in /proc.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers.procs import Child

from .conftest import Exporter, FakeNvml, Scrape

GIB = 2**30

NEVER_IMPORTED = (
    "memgov.cli",
    "memgov.pack",
    "memgov.queue",
    "memgov.ray",
    "memgov.placement",
    "memgov._claim",
    "memgov._ledger.admission",
    "typer",
    "click",
    "rich",
    "psutil",
    "torch",
    "tensorflow",
    "jax",
    "numpy",
)
"""What the serving process must not import: the command line's libraries (typer, click, rich),
memgov's other tools and the claim path, the frameworks, and psutil (a daemon's liveness is read
from /proc). Each would add resident memory that serving does not use. The job queue's metrics
are not served yet (memgov/exporter/queue.py); when they are, they read its store through a thin
reader, not the package (whose __init__ imports its submission machinery), or this list says
what they need."""
_IMPORT_LINE = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|( *)(\S+)$")


def serving_imports(log: Path) -> list[str]:
    """The modules the serving process imported, from a ``-X importtime`` log of the command:
    its lines follow the second interpreter start-up (the second top-level ``encodings``)."""
    modules: list[str] = []
    starts = 0
    for line in log.read_text().splitlines():
        found = _IMPORT_LINE.match(line)
        if found is None:
            continue
        if found.group(2) == "encodings" and len(found.group(1)) == 1:  # top level
            starts += 1
            modules = []
        modules.append(found.group(2))
    assert starts == 2, f"expected the command's and the serving process's start-up in {log}"
    return modules


def environment(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/environ", "rb") as f:
        pairs = f.read().split(b"\0")
    return dict(p.decode().split("=", 1) for p in pairs if b"=" in p)


def test_the_serving_process_imports_only_what_serving_needs(
    sim: str, exporter: Callable[..., Exporter], tmp_path: Path
) -> None:
    holder = Child(["1GiB", "--name", "lean"])
    try:
        holder.expect("admitted")
        server = exporter(flags=("-X", "importtime"))
        assert 'name="lean"' in server.text()  # it read the ledger: the readers are imported
    finally:
        holder.close()
    modules = serving_imports(server.log)
    assert {"memgov.exporter.serve", "memgov._status", "prometheus_client"} <= set(modules)
    unwanted = [m for m in modules if m.split(".")[0] in NEVER_IMPORTED or m in NEVER_IMPORTED]
    unwanted += [m for m in modules if any(m.startswith(n + ".") for n in NEVER_IMPORTED)]
    assert unwanted == []


def test_the_serving_process_has_one_malloc_arena_unless_its_user_says(
    sim: str, exporter: Callable[..., Exporter]
) -> None:
    """MALLOC_ARENA_MAX=1 reaches the exec'd process (glibc reads it only at start-up), under
    the command's PID; a value of the user's own is kept."""
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    server = exporter(env=env)
    assert environment(server.proc.pid)["MALLOC_ARENA_MAX"] == "1"
    assert "memgov.exporter" in Path(f"/proc/{server.proc.pid}/cmdline").read_text()
    mine = exporter(env={**env, "MALLOC_ARENA_MAX": "4"})
    assert environment(mine.proc.pid)["MALLOC_ARENA_MAX"] == "4"


def test_release_nvml_shuts_nvml_down_after_each_refresh_and_reads_it_again(
    fake_nvml: FakeNvml,
    exporter: Callable[..., Exporter],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """--release-nvml: every refresh initialises NVML and shuts it down after it, and each one
    reads NVML afresh (a holder's new use is shown)."""
    calls = tmp_path / "nvml-calls"
    monkeypatch.setenv("FAKE_NVML_CALLS", str(calls))
    holder = Child(["1GiB", "--name", "released"])
    try:
        holder.expect("admitted")
        fake_nvml.set({holder.proc.pid: GIB // 4})
        server = exporter(args=("--release-nvml", "--refresh", "0.2"))
        assert used(server.scrape()) == GIB // 4
        fake_nvml.set({holder.proc.pid: GIB // 2})
        moment = time.time()  # after the new figure is in place: a refresh begun later reads it
        assert used(server.scrape_after(moment)) == GIB // 2
    finally:
        holder.close()
    lines = [line.split() for line in calls.read_text().splitlines()]
    seen = [call for pid, call in lines if int(pid) == server.proc.pid]
    assert seen.count("init") >= 2
    assert seen[: 2 * (len(seen) // 2)] == ["init", "shutdown"] * (len(seen) // 2)


def used(scrape: Scrape) -> float:
    [(labels, value)] = scrape["memgov_claim_used_bytes"]
    assert labels["name"] == "released"
    return value
