"""The exporter as users run it: `memgov exporter` in its own process, scraped over HTTP.

``exporter`` starts `python -m memgov exporter --listen 127.0.0.1:PORT` with the test's
environment (its private ledger, its simulated or stand-in GPUs) and stops it after the test;
``scrape`` reads /metrics and parses it with prometheus_client's own parser. ``fake_nvml`` puts
tests/helpers/fake_nvml first on PYTHONPATH, so memgov's real NVML code runs without a GPU.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("prometheus_client", reason="the exporter's extra: memgov-gpu[exporter]")

from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.procs import terminate

HELPERS = Path(__file__).resolve().parents[1] / "helpers"
START_TIMEOUT_S = 120.0
"""A bound on start-up (imports and the first refresh), not a timing: the test machine is shared."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


Sample = tuple[dict[str, str], float]
Scrape = dict[str, list[Sample]]


def parse(text: str) -> Scrape:
    """Metric family (and sample) name -> [(labels, value)], from the exposition text."""
    found: Scrape = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return found


@dataclass
class Exporter:
    proc: subprocess.Popen[str]
    url: str
    log: Path

    def text(self) -> str:
        with urllib.request.urlopen(self.url, timeout=20) as response:
            assert response.status == 200
            return response.read().decode()

    def scrape(self) -> Scrape:
        return parse(self.text())

    def scrape_after(self, moment: float) -> Scrape:
        """The first scrape whose body was refreshed after ``moment`` (Unix time): the exporter
        serves a prepared body and refreshes it at once when the ledger changes or a holder dies
        (memgov/exporter/refresh.py), so this waits one refresh, bounded."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            scrape = self.scrape()
            refreshed = scrape["memgov_exporter_last_refresh_timestamp_seconds"][0][1]
            if refreshed > moment:
                return scrape
            if time.monotonic() > deadline:
                raise AssertionError(f"no refresh after {moment} in {START_TIMEOUT_S} s")
            time.sleep(0.02)


def start_exporter(
    tmp_path: Path,
    env: dict[str, str] | None = None,
    args: tuple[str, ...] = (),
    flags: tuple[str, ...] = (),
    port: int | None = None,
) -> Exporter:
    """`python FLAGS -m memgov exporter --listen 127.0.0.1:PORT ARGS`, answering (bounded);
    with ``port``, no --listen: ARGS say where (or the default does)."""
    listen = [] if port is not None else ["--listen", f"127.0.0.1:{(port := free_port())}"]
    log = tmp_path / f"exporter-{port}.log"
    command = [sys.executable, *flags, "-m", "memgov", "exporter"]
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [*command, *listen, *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            env=env or dict(os.environ),
        )
    exporter = Exporter(proc, f"http://127.0.0.1:{port}/metrics", log)
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            exporter.text()
            return exporter
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                stop_exporter(exporter)
                raise AssertionError(f"exporter did not answer: {log.read_text()}") from None
            time.sleep(0.1)


def stop_exporter(exporter: Exporter) -> None:
    terminate(exporter.proc, timeout=10)


@pytest.fixture
def exporter(tmp_path: Path) -> Iterator[Callable[..., Exporter]]:
    started: list[Exporter] = []

    def start(
        env: dict[str, str] | None = None,
        args: tuple[str, ...] = (),
        flags: tuple[str, ...] = (),
        port: int | None = None,
    ) -> Exporter:
        started.append(start_exporter(tmp_path, env, args, flags, port))
        return started[-1]

    yield start
    for one in started:
        stop_exporter(one)


@dataclass
class FakeNvml:
    path: Path
    uuid: str

    def set(self, processes: dict[int, int]) -> None:
        """Each host PID's device memory, as NVML will report it."""
        state = json.loads(self.path.read_text())
        state["processes"] = {self.uuid: {str(pid): b for pid, b in processes.items()}}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        tmp.replace(self.path)


@pytest.fixture
def fake_nvml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    """One stand-in 80 GiB GPU for this test and every process it starts (no MEMGOV_DEVICES)."""
    uuid = "GPU-00000000-fake-0000-0000-000000000001"
    path = tmp_path / "nvml.json"
    state: dict[str, Any] = {
        "devices": [{"uuid": uuid, "name": "NVIDIA Fake80", "total": 80 * 2**30, "used": 0}],
        "processes": {},
    }
    path.write_text(json.dumps(state))
    monkeypatch.delenv("MEMGOV_DEVICES", raising=False)
    monkeypatch.setenv("FAKE_NVML_STATE", str(path))
    monkeypatch.setenv("MEMGOV_RESERVE", "0")
    paths = [str(HELPERS / "fake_nvml"), *filter(None, [os.environ.get("PYTHONPATH")])]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))
    return FakeNvml(path, uuid)
