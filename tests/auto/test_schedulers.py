"""Each GPU scheduler's variable parses to the right budget."""

from __future__ import annotations

import pytest

from memgov._gpu import schedulers as _schedulers
from memgov._gpu.schedulers import below_enforced, read

MIB, GIB = 2**20, 2**30
TOTAL = 80 * GIB


def one(env: dict[str, str], index: int | None = 0, total: int = TOTAL):
    reading = read(total, index, env)
    assert reading.problems == []
    assert len(reading.budgets) == 1
    return reading.budgets[0]


@pytest.mark.parametrize(
    ("raw", "limit"),
    [("1024m", 1024 * MIB), ("1g", GIB), ("1048576k", GIB), ("2147483648", 2 * GIB),
     ("3G", 3 * GIB), (" 512M ", 512 * MIB)],
)  # fmt: skip
def test_hami_units(raw, limit):
    budget = one({"CUDA_DEVICE_MEMORY_LIMIT": raw})
    assert (budget.limit, budget.enforced) == (limit, True)
    assert budget.bytes == limit - max(int(limit * 0.05), 64 * MIB)


def test_hami_per_device_wins_and_follows_the_index():
    env = {"CUDA_DEVICE_MEMORY_LIMIT": "8g", "CUDA_DEVICE_MEMORY_LIMIT_1": "2g"}
    assert one(env, index=1).limit == 2 * GIB
    assert one(env, index=0).limit == 8 * GIB


def test_margin_below_enforced_limits():
    assert below_enforced(GIB) == GIB - 64 * MIB  # 5 % is 51 MiB: the 64 MiB floor applies
    assert below_enforced(10 * GIB) == 10 * GIB - int(10 * GIB * 0.05)


def test_aliyun_share_of_the_real_total():
    budget = one({"ALIYUN_COM_GPU_MEM_CONTAINER": "4", "ALIYUN_COM_GPU_MEM_DEV": "16"})
    assert (budget.bytes, budget.enforced) == (TOTAL // 4, False)
    # MiB units configured at the site: the ratio needs no unit at all.
    budget = one({"ALIYUN_COM_GPU_MEM_CONTAINER": "20480", "ALIYUN_COM_GPU_MEM_DEV": "81920"})
    assert budget.bytes == TOTAL // 4


def test_aliyun_without_device_total_assumes_gib():
    budget = one({"ALIYUN_COM_GPU_MEM_CONTAINER": "3"})
    assert budget.bytes == 3 * GIB and "GiB assumed" in budget.source


def test_kai_portion_of_the_real_total():
    # KAI's binder writes the pod's share of one GPU as "%.2f" into GPU_PORTION.
    budget = one({"GPU_PORTION": "0.25"})
    assert (budget.bytes, budget.enforced, budget.variable) == (TOTAL // 4, False, "GPU_PORTION")
    old = one({"RUNAI_NUM_OF_GPUS": "0.50"})  # KAI's deprecated name for the same value
    assert old.bytes == TOTAL // 2 and "RUNAI_NUM_OF_GPUS='0.50'" in old.source
    assert read(TOTAL, 0, {"GPU_PORTION": "1"}).budgets == []  # whole GPUs: no memory budget
    assert read(TOTAL, 0, {"GPU_PORTION": "2.00"}).budgets == []
    both = one({"GPU_PORTION": "0.25", "RUNAI_NUM_OF_GPUS": "0.75"})
    assert both.variable == "GPU_PORTION"


def test_gpu_memory_limit_is_not_kais_and_is_not_read():
    assert read(TOTAL, 0, {"GPU_MEMORY_LIMIT": str(5 * GIB)}).budgets == []


@pytest.mark.parametrize("plural", ["", "S"])
def test_container_toolkit_limit_is_enforced_mib(plural):
    budget = one({f"NVIDIA_GPU_MEMORY_LIMIT{plural}": "4096"})
    assert (budget.limit, budget.enforced) == (4 * GIB, True)
    assert budget.bytes == below_enforced(4 * GIB)
    assert "hard limit" in budget.source


def test_container_toolkit_request_is_the_budget_when_set():
    env = {"NVIDIA_GPU_MEMORY_REQUEST": "2048", "NVIDIA_GPU_MEMORY_LIMIT": "4096"}
    reading = read(TOTAL, 0, env)
    assert reading.problems == [] and len(reading.budgets) == 2
    assert reading.chosen is not None and reading.chosen.variable == "NVIDIA_GPU_MEMORY_REQUEST"
    assert (reading.chosen.bytes, reading.chosen.enforced) == (2 * GIB, False)
    # The plural wins over the singular, as in the toolkit's hook.
    env = {"NVIDIA_GPU_MEMORY_LIMITS": "1024", "NVIDIA_GPU_MEMORY_LIMIT": "4096"}
    assert one(env).limit == GIB


@pytest.mark.parametrize(
    ("var", "raw", "text"),
    [
        ("GPU_PORTION", "half", "KAI scheduler GPU_PORTION='half': accepted the share of one GPU"),
        ("GPU_PORTION", "0", "accepted the share of one GPU, a number above 0"),
        ("GPU_PORTION", "nan", "accepted the share of one GPU"),
        ("NVIDIA_GPU_MEMORY_LIMIT", "4Gi", "NVIDIA_GPU_MEMORY_LIMIT='4Gi': accepted a whole"),
        ("NVIDIA_GPU_MEMORY_REQUESTS", "-1", "accepted a whole number of MiB"),
    ],
)
def test_new_scheduler_garbage_is_a_problem(var, raw, text):
    reading = read(TOTAL, 0, {var: raw})
    assert reading.budgets == [] and text in reading.problems[0]


def test_mps_entry_of_our_device():
    env = {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=1G,1=2048M"}
    assert one(env, index=1).limit == 2 * GIB
    budget = one(env, index=0)
    assert (budget.limit, budget.bytes, budget.enforced) == (GIB, GIB - 64 * MIB, True)
    assert read(TOTAL, 2, env).budgets == []  # no entry for device 2: no budget, no problem


def test_slurm_shards_times_site_size():
    budget = one({"SLURM_SHARDS_ON_NODE": "3", "MEMGOV_SHARD_SIZE": "4GiB"})
    assert (budget.bytes, budget.enforced) == (12 * GIB, False)
    reading = read(TOTAL, 0, {"SLURM_SHARDS_ON_NODE": "3"})
    assert reading.budgets == [] and "set MEMGOV_SHARD_SIZE" in reading.problems[0]


def test_smallest_budget_is_chosen_and_capped_at_the_device():
    env = {"NVIDIA_GPU_MEMORY_REQUEST": str(6 * 1024), "CUDA_DEVICE_MEMORY_LIMIT": "4g"}
    reading = read(TOTAL, 0, env)
    assert reading.chosen is not None and reading.chosen.variable == "CUDA_DEVICE_MEMORY_LIMIT"
    big = one({"NVIDIA_GPU_MEMORY_REQUEST": str(200 * 1024)})
    assert big.bytes == TOTAL and "more than the device" in big.source


def test_nothing_set_is_no_budget():
    reading = read(TOTAL, 0, {})
    assert (reading.budgets, reading.problems, reading.chosen) == ([], [], None)


def test_unit_mistakes_are_refused():
    reading = read(TOTAL, 0, {"CUDA_DEVICE_MEMORY_LIMIT": "8"})
    assert reading.budgets == [] and "unit mistake" in reading.problems[0]
    assert _schedulers.MIN_LIMIT == 64 * MIB
