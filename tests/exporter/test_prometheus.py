"""A real Prometheus server scrapes `memgov exporter` while governed processes come and go.

Changes the host: installs Debian's ``prometheus`` package with apt-get when no ``prometheus``
binary is there (services are kept from starting by policy-rc.d, made for the install if missing
and removed after), and runs a Prometheus server on 127.0.0.1 for the test. Runs only with
``pytest --host-changes`` or MEMGOV_TEST_HOST_CHANGES=1, as root; otherwise skipped, saying why.
Every wait is bounded; the server and every holder are stopped at the end, the data folder goes
with tmp_path.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from memgov._ledger.ledger import folder_name
from tests.helpers import host_changes
from tests.helpers.procs import Child, terminate

from .conftest import Exporter, FakeNvml, free_port
from .test_exporter import _plant_live, _record

pytestmark = pytest.mark.host_changes(
    "apt-get installs Debian's prometheus and starts a Prometheus server on 127.0.0.1"
)
GIB = 2**30
SCRAPE_S = 1
WAIT_S = 60.0
POLICY = Path("/usr/sbin/policy-rc.d")


def _allowed(config: pytest.Config) -> bool:
    return host_changes.allowed(config)


def _install() -> str:
    """The prometheus binary, installed from Debian's package if missing."""
    found = shutil.which("prometheus")
    if found:
        return found
    if shutil.which("apt-get") is None:
        pytest.skip("no prometheus binary and no apt-get to install Debian's prometheus package")
    made_policy = not POLICY.exists()
    if made_policy:  # the package's service must not start: this test runs its own server
        POLICY.write_text("#!/bin/sh\nexit 101\n")
        POLICY.chmod(0o755)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        for argv in (
            ["apt-get", "update", "-q"],
            ["apt-get", "install", "-y", "-q", "--no-install-recommends", "prometheus"],
        ):
            done = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env)
            if done.returncode != 0:
                pytest.skip(f"{' '.join(argv)} failed: {done.stderr[-600:]}")
    finally:
        if made_policy:
            POLICY.unlink()
    found = shutil.which("prometheus")
    if found is None:
        pytest.skip("apt-get installed prometheus, but no prometheus binary is on PATH")
    return found


class Prometheus:
    def __init__(self, binary: str, target: str, folder: Path) -> None:
        self.port = free_port()
        config = folder / "prometheus.yml"
        config.write_text(
            f"global:\n  scrape_interval: {SCRAPE_S}s\n  scrape_timeout: {SCRAPE_S}s\n"
            f"scrape_configs:\n  - job_name: memgov\n    static_configs:\n"
            f"      - targets: ['{target}']\n"
        )
        self.log = folder / "prometheus.log"
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(
                [
                    binary,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={folder / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def api(self, path: str, **params: str) -> Any:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.loads(response.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, promql: str) -> dict[str, float]:
        """Claim name (or the empty string) -> value, for an instant query now."""
        result = self.api("query", query=promql)["result"]
        return {r["metric"].get("name", ""): float(r["value"][1]) for r in result}

    def stop(self) -> None:
        terminate(self.proc, timeout=30)


def _until(what: str, check: Callable[[], bool], server: Prometheus) -> None:
    deadline = time.monotonic() + WAIT_S

    def answered() -> bool:
        try:
            return check()
        except OSError:  # the server is still starting
            return False

    while not answered():
        if time.monotonic() > deadline or server.proc.poll() is not None:
            raise AssertionError(
                f"{what} not seen in {WAIT_S} s; prometheus log: {server.log.read_text()[-1500:]}"
            )
        time.sleep(0.25)


@pytest.fixture
def prometheus_binary(request: pytest.FixtureRequest) -> str:
    if not _allowed(request.config):
        pytest.skip(
            "changes the host (installs Debian's prometheus, starts a server): run "
            "with --host-changes or MEMGOV_TEST_HOST_CHANGES=1"
        )
    if os.geteuid() != 0:
        pytest.skip("installing Debian's prometheus package needs root")
    return _install()


@pytest.fixture
def servers() -> Iterator[list[Prometheus]]:
    started: list[Prometheus] = []
    yield started
    for server in started:
        server.stop()


def test_prometheus_scrapes_claims_as_processes_come_and_go(
    prometheus_binary: str,
    fake_nvml: FakeNvml,
    exporter: Callable[..., Exporter],
    servers: list[Prometheus],
    children: list[Child],
    tmp_path: Path,
) -> None:
    def hold(size: str, name: str) -> Child:
        child = Child([size, "--name", name])
        children.append(child)
        child.expect("admitted")
        return child

    a, b = hold("4GiB", "trainer-a"), hold("2GiB", "trainer-b")
    fake_nvml.set({a.proc.pid: 3 * GIB, b.proc.pid: GIB})
    claims = Path(os.environ["MEMGOV_DIR"], "v1", folder_name(fake_nvml.uuid), "claims")
    evil_lock = _plant_live(claims, _record('evil"\n\\ \udcff', device=fake_nvml.uuid))
    try:
        target = exporter().url.removeprefix("http://").removesuffix("/metrics")
        server = Prometheus(prometheus_binary, target, tmp_path)
        servers.append(server)
        budgets = "memgov_claim_budget_bytes"
        _until(
            "both claims", lambda: {"trainer-a", "trainer-b"} <= set(server.query(budgets)), server
        )
        assert server.query('up{job="memgov"}') == {"": 1.0}
        got = server.query(budgets)
        assert got["trainer-a"] == 4 * GIB and got["trainer-b"] == 2 * GIB
        assert [n for n in got if n.startswith("evil")] == ['evil"\\n\\ \\udcff']
        used = server.query("memgov_claim_used_bytes")
        assert used["trainer-a"] == 3 * GIB and used["trainer-b"] == GIB
        ratio = server.query("memgov_claim_used_bytes / memgov_claim_budget_bytes")
        assert ratio["trainer-a"] == 0.75

        a.kill()
        a.proc.wait(timeout=10)
        killed = time.time()
        # The first scrape of a body refreshed after the kill (the death starts that refresh at
        # once) no longer has trainer-a's series; Prometheus marks it stale, so an instant
        # query no longer returns it.
        refreshed = "memgov_exporter_last_refresh_timestamp_seconds"
        _until(
            "a scrape of a body refreshed after the kill",
            lambda: server.query(refreshed).get("", 0.0) > killed,
            server,
        )
        assert "trainer-a" not in server.query(budgets)
        c = hold("1GiB", "trainer-c")
        fake_nvml.set({b.proc.pid: GIB, c.proc.pid: GIB // 4})
        _until("trainer-c", lambda: "trainer-c" in server.query(budgets), server)
        got = server.query(budgets)
        assert "trainer-a" not in got, got
        assert got["trainer-b"] == 2 * GIB and got["trainer-c"] == GIB
        assert "trainer-a" not in server.query("memgov_claim_used_bytes")
        claimed = server.query("memgov_gpu_claimed_bytes")[""]
        assert claimed == 4 * GIB  # b + c + the planted live record (1 GiB)
    finally:
        with contextlib.suppress(OSError):
            os.close(evil_lock)
