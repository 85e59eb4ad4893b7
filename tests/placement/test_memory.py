"""The memory-realism counts (memgov/placement/memory.py): jobs, not (job, GPU) pairs."""

from __future__ import annotations

from memgov.placement import Assignment, ClusterState, Demand, Node
from memgov.placement.memory import MemoryModel, count_ooms

# T4: 15,109 MiB a GPU (the simulator's table).
NODES = [Node("a", cpu_milli=32_000, memory_mib=65_536, gpus=4, model="T4")]


def test_a_job_on_several_gpus_counts_once_and_budgets_stop_jobs_that_had_room() -> None:
    state = ClusterState(NODES)
    jobs = [
        Demand("wide", cpu_milli=1_000, num_gpu=2, gpu_milli=1000),  # overshoots GPUs 0 and 1
        Demand("small", cpu_milli=1_000, num_gpu=1, gpu_milli=300),  # overshoots; GPU 2 has room
        Demand("quiet", cpu_milli=1_000, num_gpu=1, gpu_milli=300),  # keeps to its request
        Demand("big", cpu_milli=1_000, num_gpu=1, gpu_milli=600),  # overshoots GPU 3, with
        Demand("neighbour", cpu_milli=1_000, num_gpu=1, gpu_milli=400),  # a neighbour hit
        Demand("cpu", cpu_milli=1_000),
    ]
    placed = [
        Assignment(0, (0, 1)),
        Assignment(0, (2,)),
        Assignment(0, (2,)),
        Assignment(0, (3,)),
        Assignment(0, (3,)),
        Assignment(0),
    ]
    factors = {"wide": 1.2, "small": 1.5, "big": 1.4}
    counts = count_ooms(state, jobs, placed, factors, MemoryModel())
    assert counts == {
        "oom_with_memgov_budgets": 3,  # wide, small, big: each once
        "stopped_with_room": 1,  # small: GPU 2 holds 0.45 + 0.3 of its memory
        "jobs_on_overcommitted_gpus_without_budgets": 3,  # wide (once, not twice), big, neighbour
        "budgets_below_context": 0,
    }
