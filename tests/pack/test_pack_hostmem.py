"""Host memory admission (memgov/pack/hostmem.py): real packs whose jobs need more RAM than the
host has free wait in waves, or are refused when they could never fit; nothing is OOM-killed."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import psutil
import pytest

from memgov._base.errors import ConfigError
from memgov.pack import PackConfig, hostmem

from ._util import MNIST, mnist_args, report, run_pack

GiB = 2**30


def test_gate_sizes_from_setting_history_or_default() -> None:
    total = 64 * GiB
    assert hostmem.gate("off", [], total) is None
    fixed = hostmem.gate("3GiB", [5 * GiB], total)
    assert fixed is not None and (fixed.per_job, fixed.source) == (3 * GiB, "--host-per-job")
    auto = hostmem.gate("auto", [900 * 2**20, 1000 * 2**20], total)
    # The largest recorded peak as is: the reserve is the margin (a job that grows past the
    # estimate is in MemAvailable as soon as it does). With x 1.10 + 64 MiB per job, 140 forked
    # torch jobs (~0.8 GiB each) did not fit a 125 GiB host at once.
    assert auto is not None and auto.per_job == 1000 * 2**20
    assert "largest of 2 recorded" in auto.source
    fresh = hostmem.gate(None, [], total)
    assert fresh is not None and fresh.per_job == hostmem.DEFAULT_PER_JOB
    assert fresh.reserve == int(total * 0.05)  # 3.2 GiB: more than the 2 GiB floor
    assert hostmem.reserve_for(8 * GiB) == 2 * GiB


def test_gate_learns_the_solo_job_only_where_nothing_better_is_known() -> None:
    total = 64 * GiB
    fresh = hostmem.gate(None, [], total)
    assert fresh is not None
    fresh.learn(None)  # the solo job failed: nothing learned
    assert fresh.per_job == hostmem.DEFAULT_PER_JOB
    fresh.learn(800 * 2**20)
    assert fresh.per_job == 800 * 2**20 and "solo job" in fresh.source
    for kept in (hostmem.gate("3GiB", [], total), hostmem.gate("auto", [GiB], total)):
        assert kept is not None
        before = (kept.per_job, kept.source)
        kept.learn(800 * 2**20)  # the user's estimate, or earlier packs' records, stay
        assert (kept.per_job, kept.source) == before


def test_auto_runner_forks_the_jobs_when_processes_would_not_fit(tmp_path: Path) -> None:
    from memgov.pack.plan import Context, prepare

    def prepared(name: str, **kw: Any) -> Context:
        cfg = PackConfig(
            experiment=MNIST, device="cpu", solo=False, history=False, out=tmp_path / name, **kw
        )
        return prepare(cfg)

    available = psutil.virtual_memory().available
    many = int(available // hostmem.DEFAULT_PER_JOB) + 1  # at 2 GiB each, one too many
    ctx = prepared("many", n=many)
    assert ctx.runner.name == "preload", ctx.runner_why
    assert ctx.runner_why.startswith(f"auto: preload: {many} jobs at once as processes need")
    assert any(n.startswith("runner auto: preload") for n in ctx.notes())
    few = prepared("few", n=1)
    assert few.runner.name == "process" and few.runner_why.startswith("auto: process: 1 jobs")
    chosen = prepared("chosen", n=many, runner="process")
    assert (chosen.runner.name, chosen.runner_why) == ("process", "--runner process")
    tf = prepared("tf", n=many, framework="tensorflow")
    assert tf.runner.name == "process" and "forks only jax, torch jobs" in tf.runner_why


def test_gate_counts_growth_still_ahead_of_running_jobs() -> None:
    available = psutil.virtual_memory().available
    gate = hostmem.HostGate(per_job=available // 4, source="test", reserve=0)
    assert gate.fits([])
    # Two jobs not yet measured are counted at their full size; measured ones by what is left.
    assert gate.fits([(None, False), (None, False)])
    assert not gate.fits([(None, False)] * 4)
    assert gate.fits([(gate.per_job, False)] * 8)  # all grown: already inside `available`


def test_jobs_in_training_are_measured_not_estimated() -> None:
    available = psutil.virtual_memory().available
    gate = hostmem.HostGate(per_job=available // 4, source=hostmem.DEFAULT_SOURCE, reserve=0)
    # Four jobs starting at the solo job's size do not leave room for a fifth ...
    assert not gate.fits([(None, False)] * 4)
    # ... but once two of them train at a tenth of it, that is the estimate: what the others
    # still grow is counted at the measured size, and the trained ones have no growth ahead.
    small = available // 40
    assert gate.fits([(small, True), (small, True), (None, False), (None, False)])
    assert gate.per_job == small and "first epoch (2)" in gate.source
    user = hostmem.HostGate(per_job=available // 4, source=hostmem.USER_SOURCE, reserve=0)
    assert not user.fits([(small, True), (small, True), (None, False), (None, False)])
    assert user.per_job == available // 4  # the user's estimate stays


def test_bad_setting_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="--host-per-job"):
        PackConfig(experiment=MNIST, device="cpu", host_per_job="-1GiB").check()


def _per_job_that_fits_once() -> int:
    """A per-job size one job fits in and two do not: (available - reserve) / 1.5."""
    memory = psutil.virtual_memory()
    return int((memory.available - hostmem.reserve_for(memory.total)) / 1.5)


def test_jobs_that_do_not_fit_together_run_one_after_another(tmp_path: Path) -> None:
    out = tmp_path / "out"
    per_job = _per_job_that_fits_once()
    done = run_pack(*mnist_args(out, "--no-solo", "--host-per-job", f"{per_job >> 20}MiB"))
    assert done.returncode == 0, done.stderr
    data = report(out)
    assert (data["ok"], data["failed"]) == (2, 0)
    gate = data["host_gate"]
    assert (gate["most_running"], gate["jobs_that_waited"], gate["refused"]) == (1, 1, 0)
    first, second = sorted(data["jobs"], key=lambda j: j["started_s"])
    assert second["started_s"] >= first["ended_s"]  # the second waited for the first to end
    assert data["aggregate_basis"] == "span (jobs ran in waves)"
    # The engine's decisions (memgov/queue/engine.py): the first started one job, later ones the
    # other once the first had ended.
    assert data["decisions"]["count"] >= 2 and data["decisions"]["max_ms"] is not None


def test_a_job_that_can_never_fit_is_refused_with_the_reason(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = run_pack(*mnist_args(out, "--no-solo", "--host-per-job", "64TiB"))
    assert done.returncode == 1, done.stderr
    data = report(out)
    assert (data["ok"], data["failed"], data["reasons"]) == (0, 2, {"host_memory": 2})
    for job in data["jobs"]:
        assert job["status"] == "failed" and job["epochs_done"] == 0
        assert "not started: host memory" in job["detail"]
        assert "65536.00 GiB (--host-per-job)" in job["detail"]
    assert data["host_gate"]["refused"] == 2


def test_a_job_stopped_after_an_epoch_still_sizes_the_next_pack(
    tmp_path: Path, private_ledger: Path
) -> None:
    # Stopped by --timeout in its second epoch or later: its host size is known (a whole epoch
    # ran), so the history keeps it and the next pack does not fall back to the 2 GiB default.
    out = tmp_path / "out"
    done = run_pack(
        *mnist_args(out, "--no-solo", "--timeout", "45", n=1, epochs=100000), timeout=150
    )
    data = report(out)
    job = data["jobs"][0]
    assert (job["status"], job["reason"]) == ("failed", "timeout"), done.stderr
    assert job["epochs_done"] >= 1 and job["uss_mib"]
    store = private_ledger / "v1" / "_profiles" / str(os.geteuid())
    hosts = list(store.glob("*-host-cpu-*.json"))
    assert len(hosts) == 1, hosts
    assert str(int(job["uss_mib"] * 2**20)) in hosts[0].read_text()


def test_the_solo_footprint_sizes_default_claims_so_every_job_fits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from memgov.pack.plan import learn_claim, prepare

    # A fresh ledger: nothing recorded, so 1 GiB each, and 140 of them do not fit 139 GiB.
    monkeypatch.setenv("MEMGOV_DEVICES", "sim0:139GiB")
    ctx = prepare(
        PackConfig(experiment=MNIST, n=140, history=False, device="cpu", out=tmp_path / "out")
    )
    main = next(p for p in ctx.plans if p.role == "main")
    assert main.claim_bytes == GiB and (ctx.claim_source or "").startswith("default")
    learn_claim(ctx, 890 * 2**20)  # the solo job's footprint, as on the H200
    assert main.claim_bytes is not None and main.claim_bytes * 140 <= 139 * GiB
    assert main.claim_bytes >= (890 + 64) * 2**20
    assert "this pack's solo job: footprint" in (ctx.claim_source or "")
    explicit = prepare(
        PackConfig(
            experiment=MNIST,
            n=140,
            history=False,
            device="cpu",
            claim="1GiB",
            out=tmp_path / "explicit",
        )
    )
    learn_claim(explicit, 890 * 2**20)
    assert next(p for p in explicit.plans if p.role == "main").claim_bytes == GiB
