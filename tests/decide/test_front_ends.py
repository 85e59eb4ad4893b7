"""Every front end places by the one registry (memgov/decide/): the queue, the trace simulator and
pack call the code a name resolves to there, so none can keep a copy of its own.

A spy replaces a policy of the registry; each front end must then score with the spy. A front
end with a registry or a copy of its own would not, and its test fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import memgov.queue as q
from memgov import decide
from memgov.decide import policies
from memgov.placement import Demand, Node, simulate
from tests.helpers.queuejobs import sleeper, write_queue

ROOT = Path(__file__).resolve().parents[2]
NODES = [Node(f"n{i}", cpu_milli=16_000, memory_mib=65_536, gpus=2, model="T4") for i in range(3)]
TRACE = [
    Demand("a", cpu_milli=2_000, num_gpu=1, gpu_milli=500),
    Demand("b", cpu_milli=2_000, num_gpu=1, gpu_milli=300),
    Demand("c", cpu_milli=4_000, num_gpu=1, gpu_milli=1000),
]


@pytest.fixture
def spied(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every policy of the registry replaced by a subclass that notes each score it gives."""
    calls: list[str] = []
    for name, make in list(policies.POLICIES.items()):
        base: Any = make

        def score(self: Any, *args: Any, _base: Any = base) -> Any:
            calls.append(self.name)
            return _base.score(self, *args)

        monkeypatch.setitem(
            policies.POLICIES, name, type(f"Spy_{base.__name__}", (base,), {"score": score})
        )
    yield calls


@pytest.mark.parametrize("name", list(policies.POLICIES))
def test_the_queue_and_the_simulator_score_with_the_registrys_code(
    name: str, spied: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEMGOV_DEVICES", "sim0:16GiB,sim1:16GiB")
    monkeypatch.setenv("MEMGOV_DIR", str(tmp_path / "memgov"))
    result = simulate(TRACE, NODES, name, seed=3)
    assert result.placed > 0 and spied and set(spied) == {name}, spied
    spied.clear()
    jobs = [{"name": f"j{i}", "cmd": sleeper(0.05), "claim": "1GiB"} for i in range(3)]
    report = q.run(write_queue(tmp_path / "q.toml", jobs), name).to_json()
    assert report["policy"] == name and [j["end"] for j in report["jobs"]] == ["ok"] * 3
    assert spied and set(spied) == {name}, spied  # the queue placed with the same class


@pytest.mark.parametrize("alias", ["dotprod", "default", "FIFO", " BestFit "])
def test_an_alias_or_a_spelling_resolves_to_one_policy_everywhere(alias: str) -> None:
    key = decide.resolve(alias)
    assert type(decide.get(alias)) is policies.POLICIES[key]
    assert simulate(TRACE, NODES, alias, seed=1).policy == key


def test_every_policy_says_what_it_needs_and_places_a_host_view() -> None:
    """Each one places on a host without learned figures (what it does without them)."""
    gib = 1 << 30
    for name in policies.POLICIES:
        policy = decide.get(name)
        assert policy.needs and isinstance(policy.needs, str)
        jobs = [decide.Candidate(i, "k", 2 * gib, None, None) for i in range(4)]
        gpus = [decide.Gpu(0, 16 * gib, 16 * gib), decide.Gpu(1, 16 * gib, 3 * gib)]
        view = decide.View(0.0, jobs, gpus, 8, decide.Learned())
        placed = decide.place(policy, view, np.random.default_rng(0))
        assert placed, name
        used: dict[int, int] = {}
        for _job, gpu in placed:
            used[gpu] = used.get(gpu, 0) + 2 * gib
        assert used.get(0, 0) <= 16 * gib and used.get(1, 0) <= 3 * gib, (name, placed)
        if policy.exclusive:
            assert len(placed) == len({g for _j, g in placed}), (name, placed)


SPY = """
import os
if os.environ.get("MEMGOV_TEST_SPY"):
    from memgov.decide import policies

    class Spy(policies.POLICIES["fifo"]):
        def score(self, *args):
            with open(os.environ["MEMGOV_TEST_SPY"], "a") as f:
                f.write(type(self).__mro__[1].__name__ + "\\n")
            return super().score(*args)

    policies.POLICIES["fifo"] = Spy
"""


def test_pack_places_its_copies_by_the_registrys_policy(tmp_path: Path) -> None:
    """pack's engine (a process of its own) asks the registry: a spy loaded at its start-up
    (sitecustomize) sees each of its decisions."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SPY)
    seen = tmp_path / "seen.txt"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]),
        "MEMGOV_TEST_SPY": str(seen),
        "MEMGOV_DIR": str(tmp_path / "memgov"),
    }
    out = tmp_path / "out"
    args = ["--n", "2", "--device", "cpu", str(ROOT / "experiments" / "mnist"), "--epochs", "1"]
    args += ["--out", str(out), "--json", "--", "--limit", "256", "--eval-limit", "64"]
    done = subprocess.run(
        [sys.executable, "-m", "memgov", "pack", *args],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["ok"] == 2
    assert seen.read_text().split() and set(seen.read_text().split()) == {"Fifo"}


def test_the_replay_runs_the_queues_policies_on_its_model() -> None:
    """benchmarks/queue/replay.py (the tuning tool of memgov's numbers) drives the same core."""
    script = ROOT / "benchmarks" / "queue" / "replay.py"
    done = subprocess.run(
        [sys.executable, str(script), "--set", "tuning", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(done.stdout)
    assert {(r["state"], r["policy"]) for r in rows} == {
        (state, name)
        for state in ("cold", "warm")
        for name in ("memgov", "fifo", "tetris", "bestfit", "sjf-exclusive")
    }
    exclusive = [r for r in rows if r["policy"] == "sjf-exclusive"]
    assert all(r["p90_slowdown"] < 1.1 for r in exclusive)  # one job per GPU: its solo time
