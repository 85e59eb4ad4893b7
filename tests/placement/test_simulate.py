"""The simulator's protocol on tiny traces (memgov/placement/simulate.py)."""

from __future__ import annotations

import numpy as np
import pytest

from memgov import decide
from memgov.placement import Demand, Node, arrivals, simulate
from memgov.placement.simulate import allocation_curve

NODES = [Node(f"n{i}", cpu_milli=16_000, memory_mib=65_536, gpus=2, model="T4") for i in range(4)]
CAPACITY = 8 * 1000
WORKLOAD = [
    Demand("a", cpu_milli=2_000, num_gpu=1, gpu_milli=500),
    Demand("b", cpu_milli=2_000, num_gpu=1, gpu_milli=300),
    Demand("c", cpu_milli=4_000, num_gpu=1, gpu_milli=1000),
    Demand("d", cpu_milli=1_000),
]


def test_arrivals_are_the_trace_shuffled_then_inflated_to_130_percent() -> None:
    jobs = arrivals(WORKLOAD, CAPACITY, seed=42)
    assert sorted(j.name for j in jobs[:4]) == ["a", "b", "c", "d"]  # every job once, first
    requested = sum(j.total_gpu_milli for j in jobs)
    assert requested <= 1.3 * CAPACITY
    assert requested > 1.3 * CAPACITY - 1000  # stopped by the first draw that would cross
    assert len(jobs) > 4 and all(j in WORKLOAD for j in jobs)
    assert jobs == arrivals(WORKLOAD, CAPACITY, seed=42)
    assert [j.name for j in jobs] != [j.name for j in arrivals(WORKLOAD, CAPACITY, seed=43)]


def test_a_trace_above_the_target_is_thinned() -> None:
    many = [Demand(f"j{i}", 1_000, num_gpu=1, gpu_milli=1000) for i in range(20)]
    jobs = arrivals(many, CAPACITY, seed=1)
    assert sum(j.total_gpu_milli for j in jobs) <= 1.3 * CAPACITY and len(jobs) == 10


def test_simulate_reports_the_curve_and_the_final_share() -> None:
    result = simulate(WORKLOAD, NODES, "bestfit", seed=42)
    assert result.placed + result.failed == result.arrived
    assert result.total_gpus == 8
    # The last arrival stops within one job of 130 % (a GPU of 8 is 12.5 %).
    assert max(result.curve) >= 117 and result.final_percent == result.curve[max(result.curve)]
    assert 0 < result.final_percent <= 100
    assert result.final_percent == simulate(WORKLOAD, NODES, "bestfit", seed=42).final_percent
    values = list(result.curve.values())
    assert values == sorted(values)  # jobs never leave: allocation only grows


@pytest.mark.parametrize("policy", decide.names())
def test_every_policy_runs_the_protocol(policy: str) -> None:
    result = simulate(WORKLOAD, NODES, policy, seed=7)
    assert result.policy == decide.resolve(policy)
    assert result.arrived == len(arrivals(WORKLOAD, CAPACITY, seed=7))


def test_the_curve_averages_arrivals_by_rounded_percent() -> None:
    # 10 GPUs: arrivals at 1.0 %, 1.2 %, 2.6 % of GPU milli; allocated 1.0 %, 1.0 %, 2.0 %.
    curve = allocation_curve(np.array([100, 120, 260]), np.array([100, 100, 200]), 10, top=4)
    # 2 % has no arrival of its own: the mean of those within 1 % (1, 1 and 3 %), as pandas rounds.
    assert curve == {0: 1.0, 1: 1.0, 2: 1.33, 3: 2.0, 4: 2.0}
