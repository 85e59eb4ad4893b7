"""On a GPU host with MPS: `memgov mps stop` and the daemon() context leave no daemon or server.

Run on a GPU machine (root, nvidia-cuda-mps-control, torch+CUDA) by ``bash benchmarks/gpu/verify.sh
gpu`` (its own call: not in verify.sh's default set); skipped anywhere else.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from memgov._gpu import nvml as _nvml
from tests.helpers.procs import run_memgov

NAMES = ("nvidia-cuda-mps-control", "nvidia-cuda-mps-server")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        shutil.which(NAMES[0]) is None or not _nvml.devices(),
        reason="needs an NVIDIA GPU and nvidia-cuda-mps-control",
    ),
]

# 1 GiB: on the H200 (driver 580, CUDA 13) a CUDA context alone does not fit in a 512 MiB hard
# limit (CUDA error: out of memory at initialisation, seen on 2026-11-24).
CLIENT = """
import memgov
c = memgov.claim("1GiB", name="mps-test")
import torch
torch.zeros(1, device="cuda"); torch.cuda.synchronize()
print(c.mode, flush=True)
"""

CONTEXT = """
import time
from memgov._gpu import mps as _mps
with _mps.daemon():
    print("up", flush=True)
    time.sleep(120)
"""


def mps_processes() -> set[int]:
    # Process names are cut to 15 characters by the kernel: "nvidia-cuda-mps" is both.
    return {
        p.pid
        for p in psutil.process_iter(["name"])
        if str(p.info["name"] or "").startswith("nvidia-cuda-mps")
    }


def env_for(ledger: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("CUDA_MPS_") and k not in ("MEMGOV_DEVICES", "CUDA_VISIBLE_DEVICES")
    }
    env["MEMGOV_DIR"] = str(ledger)
    return env


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return run_memgov("mps", *args, env=env, timeout=60)


def gone(before: set[int], timeout: float = 5.0) -> set[int]:
    deadline = time.monotonic() + timeout
    while (left := mps_processes() - before) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def test_mps_stop_leaves_no_daemon_or_server(private_ledger: Path) -> None:
    pytest.importorskip("torch")
    env = env_for(private_ledger)
    before = mps_processes()
    started = cli("start", "--json", env=env)
    try:
        assert started.returncode == 0, started.stderr
        client = subprocess.run(
            [sys.executable, "-c", CLIENT], env=env, capture_output=True, text=True, timeout=120
        )
        assert client.stdout.split() == ["hard"], client.stderr[-2000:]
        status = json.loads(cli("status", "--json", env=env).stdout)
        assert status["running"] and status["started_by_memgov"]
    finally:
        stopped = cli("stop", "--json", env=env)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert json.loads(stopped.stdout)["left"] == []
    assert gone(before) == set()
    assert json.loads(cli("status", "--json", env=env).stdout)["running"] is False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_daemon_context_stops_on_signal(private_ledger: Path, sig: signal.Signals) -> None:
    env = env_for(private_ledger)
    before = mps_processes()
    ctx = subprocess.Popen(
        [sys.executable, "-c", CONTEXT],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert ctx.stdout is not None and ctx.stdout.readline().strip() == "up"
        assert mps_processes() - before, "no MPS daemon came up"
        ctx.send_signal(sig)
        ctx.wait(30)
    finally:
        if ctx.poll() is None:
            ctx.kill()
            cli("stop", "--force", env=env)
    assert gone(before) == set()


def test_no_daemon_in_the_pipe_folder_means_soft(
    private_ledger: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from memgov._gpu import enforce as _enforce
    from memgov._gpu.devices import devices

    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(private_ledger / "no-daemon"))
    plan = _enforce.decide(devices()[:1], cuda_initialized=False)
    assert not plan.hard
    assert f"no MPS daemon reachable at {private_ledger / 'no-daemon'}" in plan.reason


HOLD = """
import sys, time
import memgov
c = memgov.claim("1GiB", name="mps-hold")
import torch
torch.zeros(1, device="cuda"); torch.cuda.synchronize()
print(c.mode, flush=True)
sys.stdin.readline()
"""


def test_a_real_server_is_under_its_daemon_so_claims_need_not_ask(private_ledger: Path) -> None:
    """The no-query check rests on two facts of a real MPS host: the server runs under the
    control daemon (its child) as the client's user, and memgov's daemon has its pipe folder in
    its environment. With a client of this user connected, the check answers without a query."""
    pytest.importorskip("torch")
    from memgov._gpu import mps as _mps, mpsctl as _mpsctl

    env = env_for(private_ledger)
    started = cli("start", "--json", env=env)
    try:
        assert started.returncode == 0, started.stderr
        client = subprocess.Popen(
            [sys.executable, "-c", HOLD],
            env=env,
            text=True,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        try:
            assert client.stdout is not None and client.stdout.readline().split() == ["hard"]
            pipe = _mps.paths(0).pipe  # MEMGOV_DIR is private_ledger here too
            daemon = psutil.Process(int((pipe / "nvidia-cuda-mps-control.pid").read_text()))
            servers = [
                c for c in daemon.children(recursive=True) if c.name().startswith("nvidia-cuda-mps")
            ]
            assert servers, [c.name() for c in daemon.children(recursive=True)]
            assert all(s.uids().real == os.getuid() for s in servers)
            assert _mpsctl.servers_all_ours([pipe])
        finally:
            assert client.stdin is not None
            client.stdin.write("\n")
            client.stdin.flush()
            client.wait(60)
    finally:
        cli("stop", "--force", env=env)
