"""Past the MPS client cap and the context wall: how many jobs pack runs at once, and why not more.

Plans and reasons are checked as functions; the context limit also end to end, with real tiny
CPU jobs claiming on a simulated GPU whose context limit is set (MEMGOV_CONTEXTS): the ledger then
refuses (or queues) a job with that reason, as it does on a real GPU by default.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import memgov
from memgov._gpu import mpsctl as _mpsctl
from memgov.pack import stats
from memgov.pack.config import PackConfig
from memgov.pack.jobs import classify
from memgov.pack.plan import _plans

from ._util import MNIST, mnist_args, report, run_pack


def cfg(**kw: object) -> PackConfig:
    return PackConfig(experiment=MNIST, **kw)


def test_daemons_for_counts_48_clients_each(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MEMGOV_MPS_CLIENTS", raising=False)
    assert [_mpsctl.daemons_for(n) for n in (1, 48, 49, 96, 97, 140)] == [1, 1, 2, 2, 3, 3]
    monkeypatch.setenv("MEMGOV_MPS_CLIENTS", "60")
    assert _mpsctl.daemons_for(140) == 3


def test_jobs_at_once_are_capped_by_clients_or_contexts() -> None:
    main = _plans(cfg(n=140), [140], True, 48, 2**30, 72)[-1]
    assert (main.parallel, main.held_by) == (140, None)  # 3 daemons hold 140 at once
    main = _plans(cfg(n=140, mps_daemons=2), [140], True, 48, 2**30, 72)[-1]
    assert (main.parallel, main.held_by) == (96, "mps_clients")
    main = _plans(cfg(n=140), [140], False, 48, 2**30, 72)[-1]
    assert (main.parallel, main.held_by) == (72, "contexts")  # no MPS: the context wall
    main = _plans(cfg(n=140, parallel=50), [140], False, 48, 2**30, 72)[-1]
    assert (main.parallel, main.held_by) == (50, None)
    main = _plans(cfg(n=140), [140], False, 48, 2**30, None)[-1]
    assert (main.parallel, main.held_by) == (140, None)  # CPU / simulated: no context limit


def test_capacity_names_the_binding_limit() -> None:
    run = {"footprint_max_mib": 884.0, "uss_per_job_mib": 640.0}
    # One 140 GiB GPU, 1 GiB claims, 16 cores; the cases differ in the MPS and context limits.
    host: dict[str, int] = {
        "device_total": 143771 * 2**20,
        "device_free_before": 143000 * 2**20,
        "claim_bytes": 1037 * 2**20,
        "ledger_capacity": 143000 * 2**20,
        "host_available": 120 * 2**30,
        "cores": 16,
    }
    got = stats.capacity(run, **host, mps_limit=None, contexts=72, concurrent=72)
    assert got["binding"] == "contexts" and got["jobs_fit"]["contexts"] == 72
    assert got["cores"] == {"cores": 16, "jobs_at_once": 72, "shared": True}
    got = stats.capacity(run, **host, mps_limit=3 * 48, concurrent=140)
    assert got["binding"] == "gpu_memory_by_claim" and got["jobs_fit"]["mps_clients"] == 144


START = {"event": "start"}


@pytest.mark.parametrize(
    ("events", "reason"),
    [
        # The wall: CUDA says "out of memory" while creating the context, before the job starts.
        (
            [
                {
                    "event": "error",
                    "kind": "oom",
                    "message": "RuntimeError: CUDA error: out of memory",
                }
            ],
            "contexts",
        ),
        # The same words after the start are an allocation that did not fit (the rogue).
        ([START, {"event": "error", "kind": "oom", "message": "CUDA error: out of memory"}], "oom"),
        (
            [
                START,
                {
                    "event": "error",
                    "kind": "oom",
                    "message": "OutOfMemoryError: CUDA out of memory. Tried to allocate 4.00 GiB",
                },
            ],
            "oom",
        ),
        (
            [
                {
                    "event": "error",
                    "kind": "cuda",
                    "message": "AcceleratorError: CUDA error: all "
                    "CUDA-capable devices are busy or unavailable",
                }
            ],
            "mps_clients",
        ),
        (
            [
                {
                    "event": "error",
                    "kind": "other",
                    "message": "BudgetExceeded: cannot claim 1 GiB on GPU-x: ...; CUDA "
                    "context limit 72 reached on GPU-x (72 claims without MPS; ...)",
                }
            ],
            "contexts",
        ),
    ],
)
def test_context_wall_and_full_mps_server_are_reasons(
    events: list[dict[str, object]], reason: str
) -> None:
    assert classify(events, 1, None, [], None)[0] == reason


def test_a_job_past_the_context_limit_is_refused_with_that_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEMGOV_DEVICES", "sim0:64GiB")
    monkeypatch.setenv("MEMGOV_CONTEXTS", "1")
    held = memgov.claim("1GiB", name="holder-in-test")  # the one context the GPU takes
    out = tmp_path / "out"
    try:
        done = run_pack(*mnist_args(out, "--claim", "1GiB", "--no-solo", n=1))
    finally:
        held.release()
    assert done.returncode == 1, done.stderr
    data = report(out)
    assert data["reasons"] == {"contexts": 1}
    assert "CUDA context limit 1 reached on sim0" in data["jobs"][0]["detail"]


def test_jobs_past_the_context_limit_queue_with_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEMGOV_DEVICES", "sim0:64GiB")
    monkeypatch.setenv("MEMGOV_CONTEXTS", "1")
    out = tmp_path / "out"
    done = run_pack(*mnist_args(out, "--claim", "1GiB", "--no-solo", "--wait", "90"), timeout=240)
    assert done.returncode == 0, done.stderr + done.stdout
    data = report(out)
    assert (data["ok"], data["n"]) == (2, 2)
    first, second = sorted(data["jobs"], key=lambda j: j["epoch_spans"][0][0])
    # One context at a time: the second job trained only after the first had ended.
    assert second["epoch_spans"][0][0] >= first["epoch_spans"][-1][1]


def test_many_jobs_at_once_get_one_hardware_connection_each() -> None:
    from types import SimpleNamespace

    from memgov.pack import engine

    def context(limit: int | None, cpu: bool = False) -> Any:
        """A stand-in for engine.Context: one_connection reads only these two fields."""
        return SimpleNamespace(cpu=cpu, context_limit=limit)

    gpu, cpu = context(72), context(None, cpu=True)
    assert engine.one_connection(gpu, 72, {}) is None  # below the default wall: left alone
    why = engine.one_connection(gpu, 140, {})
    assert why and why.startswith("CUDA_DEVICE_MAX_CONNECTIONS=1") and "140 jobs at once" in why
    assert engine.one_connection(gpu, 140, {"CUDA_DEVICE_MAX_CONNECTIONS": "4"}) is None  # user's
    assert engine.one_connection(cpu, 140, {}) is None  # no GPU, no connections
    # MEMGOV_CONTEXTS moves the threshold with the context limit; off: the default stays
    assert engine.one_connection(context(120), 100, {}) is None
    assert engine.one_connection(context(None), 100, {})


def test_an_automatic_claim_shrinks_so_every_job_fits_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from memgov.pack import history

    # Footprints of 1,000 MiB recorded: the automatic claim is 1,164 MiB, and 8 of them do not
    # fit a 9 GiB GPU; 8 x 1,152 MiB do, and 1,152 MiB is still over 1,000 + 64 MiB.
    history.record(history.key("mnist", "torch", 32), [1000 * 2**20])
    monkeypatch.setenv("MEMGOV_DEVICES", "sim0:9GiB")
    monkeypatch.setenv("MEMGOV_RESERVE", "0")
    out = tmp_path / "out"
    done = run_pack(*mnist_args(out, "--no-solo", "--batch", "32", n=8), timeout=300)
    assert done.returncode == 0, done.stderr
    data = report(out)
    assert data["claim"]["mib"] == 1152 and "so that 8 jobs fit" in data["claim"]["source"]
    assert (data["ok"], data["failed"]) == (8, 0)
    # Where the footprints do not allow it (here: 2 jobs fit anyway), the claim stays as is.
    out2 = tmp_path / "out2"
    done = run_pack(*mnist_args(out2, "--no-solo", "--batch", "32"), timeout=300)
    assert done.returncode == 0, done.stderr
    assert report(out2)["claim"]["mib"] == 1164
