"""Every policy on two simulated GPUs with real processes: what each starts, where, and that no
GPU is ever given more than it holds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import memgov.queue as q
from memgov import decide
from memgov.queue.store import Store
from tests.helpers.queuejobs import GIB, overlapping, peak_claims, sleeper, write_queue

POLICIES = ("fifo-exclusive", "sjf-exclusive", "fifo", "bestfit", "tetris", "memgov")


def mix(tmp_path: Path) -> list[dict[str, Any]]:
    """Two big jobs (10 GiB: never two on one 16 GiB GPU) and four small ones."""
    jobs: list[dict[str, Any]] = []
    for i, (size, secs, kind) in enumerate(
        [
            (10, 1.2, "big"),
            (10, 1.0, "big"),
            (3, 0.4, "small"),
            (3, 0.3, "small"),
            (2, 0.5, "small"),
            (4, 0.2, "small"),
        ]
    ):
        jobs.append(
            {
                "name": f"j{i}",
                "cmd": sleeper(secs),
                "claim": f"{size}GiB",
                "kind": kind,
                "duration": secs,
            }
        )
    return jobs


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_runs_the_mix_within_each_gpus_memory(tmp_path: Path, policy: str) -> None:
    path = write_queue(tmp_path / "q.toml", mix(tmp_path))
    report = q.run(path, policy).to_json()
    assert report["policy"] == policy
    assert [j["end"] for j in report["jobs"]] == ["ok"] * 6, report["jobs"]
    assert all(peak <= 16 * GIB for peak in peak_claims(report).values())
    assert {j["gpu"] for j in report["jobs"]} == {0, 1}  # both GPUs used
    assert report["decisions"]["count"] >= 1
    assert report["makespan_s"] >= max(j["end_s"] for j in report["jobs"]) - 1e-6
    if policy.endswith("-exclusive"):
        assert not overlapping(report, 0) and not overlapping(report, 1)
    else:
        assert overlapping(report, 0) or overlapping(report, 1)  # small jobs shared a GPU


def test_sjf_starts_the_shortest_first_and_fifo_exclusive_in_order(tmp_path: Path) -> None:
    # Three different commands (three jobs to the profile store), so each has its own history.
    jobs = [
        {"name": f"j{i}", "cmd": sleeper(0.2 + i / 100), "claim": "1GiB", "gpu": 0, "duration": d}
        for i, d in enumerate([3.0, 1.0, 2.0])
    ]
    path = write_queue(tmp_path / "q.toml", jobs)
    sjf = q.run(path, "sjf-exclusive").to_json()
    order = [j["name"] for j in sorted(sjf["jobs"], key=lambda j: j["start_s"])]
    assert order == ["j1", "j2", "j0"]
    path2 = write_queue(tmp_path / "q2.toml", [*jobs[:2], {**jobs[2], "name": "j2b"}])
    fifo = q.run(path2, "fifo-exclusive").to_json()
    order = [j["name"] for j in sorted(fifo["jobs"], key=lambda j: j["start_s"])]
    assert order == ["j0", "j1", "j2b"]


def test_a_pinned_job_runs_on_its_gpu(tmp_path: Path) -> None:
    jobs: list[dict[str, Any]] = [
        {"name": "pinned", "cmd": sleeper(0.1), "claim": "1GiB", "gpu": 1},
        {"name": "free", "cmd": sleeper(0.1), "claim": "1GiB"},
    ]
    report = q.run(write_queue(tmp_path / "q.toml", jobs), "fifo").to_json()
    assert {j["name"]: j["gpu"] for j in report["jobs"]}["pinned"] == 1


def test_memgov_holds_back_a_co_location_learned_to_slow_both(tmp_path: Path) -> None:
    """With alpha 2 between kinds a and b (each would run 3x slower beside the other), memgov
    never puts an a beside a b; with the prior (0.15) it does share a GPU."""
    store = Store()
    slow = decide.Learned(alpha={"a|b": 2.0, "b|a": 2.0})
    store.write_extra("learned.json", slow.to_json())
    jobs = [
        {
            "name": f"{k}{i}",
            "cmd": sleeper(0.4),
            "claim": "2GiB",
            "kind": k,
            "gpu": 0,
            "duration": 0.4,
        }
        for i, k in enumerate("abab")
    ]
    report = q.run(write_queue(tmp_path / "q.toml", jobs), "memgov").to_json()
    spans = [(j["start_s"], j["end_s"], j["kind"]) for j in report["jobs"]]
    for s1, e1, k1 in spans:
        for s2, e2, k2 in spans:
            if k1 != k2:
                assert e1 <= s2 or e2 <= s1, spans  # never ran together
    store.write_extra("learned.json", decide.Learned().to_json())
    report = q.run(write_queue(tmp_path / "q2.toml", jobs), "memgov").to_json()
    assert overlapping(report, 0)


def test_memgov_reserves_room_for_a_big_job_instead_of_starving_it(tmp_path: Path) -> None:
    """One GPU: a long 10 GiB job runs, a 12 GiB job waits for it; once that one has waited
    longer than its expected time, small jobs that would not end before it do not take the room
    it needs."""
    jobs = [
        {"name": "first", "cmd": sleeper(1.0), "claim": "10GiB", "gpu": 0, "duration": 1.0},
        {
            "name": "big",
            "cmd": sleeper(0.2),
            "claim": "12GiB",
            "gpu": 0,
            "duration": 0.2,
            "arrival": 0.2,
        },
        {
            "name": "long-small",
            "cmd": sleeper(0.2),
            "claim": "5GiB",
            "gpu": 0,
            "duration": 30.0,
            "arrival": 0.9,  # after "big" has waited 3x its expected time (RESERVE_AFTER)
        },
    ]
    report = q.run(write_queue(tmp_path / "q.toml", jobs), "memgov").to_json()
    rows = {j["name"]: j for j in report["jobs"]}
    assert rows["big"]["start_s"] < rows["long-small"]["start_s"]


def test_an_unknown_policy_is_refused_with_the_accepted_names(tmp_path: Path) -> None:
    from memgov._base.errors import ConfigError

    path = write_queue(tmp_path / "q.toml", [{"cmd": sleeper(0)}])
    with pytest.raises(ConfigError, match="accepted memgov, fifo, fifo-exclusive"):
        q.run(path, "drf")
    assert q.jobs()[0] == []  # refused before anything was queued


def test_a_job_no_gpu_can_hold_fails_at_once_saying_why(tmp_path: Path) -> None:
    jobs: list[dict[str, Any]] = [
        {"name": "huge", "cmd": sleeper(0), "claim": "20GiB"},
        {"name": "nowhere", "cmd": sleeper(0), "claim": "1GiB", "gpu": 5},
        {"name": "fine", "cmd": sleeper(0), "claim": "1GiB"},
    ]
    report = q.run(write_queue(tmp_path / "q.toml", jobs), "memgov").to_json()
    rows = {j["name"]: j for j in report["jobs"]}
    assert rows["fine"]["end"] == "ok"
    assert rows["huge"]["end"] == "failed" and "more than any GPU" in rows["huge"]["detail"]
    assert rows["nowhere"]["end"] == "failed" and "GPUs 0..1" in rows["nowhere"]["detail"]


def test_memgov_packs_unless_a_bound_or_a_measured_slowdown_says_wait() -> None:
    """Ten ready 1 GiB jobs, one GPU. By default memgov starts all ten (the prior predicts
    sharing helps); with ``max_slowdown`` 1.5 a pair never measured counts as the sum of its GPU
    utilisations (1 each, unmeasured): one starts alone; measured to share well (alpha 0.02),
    all ten (1.18x); measured to time-slice (alpha 1.2), one, bound or not."""
    from memgov.decide import Candidate, Gpu, View, get, place

    def view(learned: decide.Learned) -> View:
        jobs = [
            Candidate(id=i, kind="small", claim=GIB, expected_s=10.0, gpu=None) for i in range(10)
        ]
        return View(
            now=0.0, jobs=jobs, gpus=[Gpu(0, 80 * GIB, 80 * GIB)], cores=16, learned=learned
        )

    unknown, shares_well = decide.Learned(), decide.Learned(alpha={"small|small": 0.02})
    slices = decide.Learned(alpha={"small|small": 1.2})
    assert len(place(get("memgov"), view(unknown))) == 10
    assert len(place(get("memgov", max_slowdown=1.5), view(unknown))) == 1
    assert len(place(get("memgov", max_slowdown=1.5), view(shares_well))) == 10
    assert len(place(get("memgov"), view(slices))) == 1
    assert len(place(get("fifo"), view(slices))) == 10


def test_bestfit_puts_a_job_on_the_fuller_gpu_by_its_real_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GPU 0 holds a 10 GiB job, GPU 1 a 15 GiB one: a 5 GiB job belongs on GPU 1. The placement
    library's node score tied 80 GiB GPUs up to ~13 GiB apart, and GPU 0 won."""
    monkeypatch.setenv("MEMGOV_DEVICES", "sim0:80GiB,sim1:80GiB")
    jobs = [
        {"name": "ten", "cmd": sleeper(1.5), "claim": "10GiB", "gpu": 0},
        {"name": "fifteen", "cmd": sleeper(1.5), "claim": "15GiB", "gpu": 1},
        {"name": "next", "cmd": sleeper(0.2), "claim": "5GiB", "arrival": 0.3},
    ]
    report = q.run(write_queue(tmp_path / "q.toml", jobs), "bestfit").to_json()
    where = {j["name"]: j["gpu"] for j in report["jobs"]}
    assert [j["end"] for j in report["jobs"]] == ["ok"] * 3, report["jobs"]
    assert where == {"ten": 0, "fifteen": 1, "next": 1}, report["jobs"]


def test_a_slowdown_bound_runs_jobs_never_measured_together_alone(tmp_path: Path) -> None:
    """--max-slowdown 1.5: four small jobs never measured beside each other (utilisation
    unknown: 1 each, a predicted 2x) run one per GPU at a time; fifo's bound is refused."""
    from memgov._base.errors import ConfigError

    jobs = [{"name": f"j{i}", "cmd": sleeper(0.3), "claim": "1GiB", "kind": "k"} for i in range(4)]
    path = write_queue(tmp_path / "q.toml", jobs)
    report = q.run(path, "memgov", max_slowdown=1.5).to_json()
    assert [j["end"] for j in report["jobs"]] == ["ok"] * 4
    assert not overlapping(report, 0) and not overlapping(report, 1)
    with pytest.raises(ConfigError, match="only policy 'memgov' holds one"):
        q.run(path, "fifo", max_slowdown=1.5)
    with pytest.raises(ConfigError, match=r"accepted a number of 1\.0 or more"):
        q.run(path, "memgov", max_slowdown=0.5)
