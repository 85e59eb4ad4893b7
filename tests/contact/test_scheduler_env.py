"""Budgets that schedulers hand down, read in a real process: KAI's GPU_PORTION, the NVIDIA
container toolkit's NVIDIA_GPU_MEMORY_LIMIT/REQUEST (both wake auto-enable through the .pth), and
torch's allocator settings under either name."""

from __future__ import annotations

import json

import pytest
from memgov_torch import user_fraction

from memgov._gpu.schedulers import below_enforced

GIB = 2**30
SHOW = "import torch, memgov, json; c = memgov.current(); print(json.dumps(c and c.bytes))"


@pytest.mark.parametrize(
    ("variables", "budget"),
    [
        ({"GPU_PORTION": "0.25"}, 4 * GIB),
        ({"NVIDIA_GPU_MEMORY_LIMIT": "2048"}, below_enforced(2 * GIB)),
        ({"NVIDIA_GPU_MEMORY_REQUESTS": "1024", "NVIDIA_GPU_MEMORY_LIMITS": "2048"}, GIB),
    ],
)
def test_scheduler_variable_alone_governs_the_program(env, py, variables, budget):
    env.update(variables)  # no MEMGOV_CLAIM: the variable itself must wake auto-enable
    result = py(SHOW, env)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == budget
    assert "warning" not in result.stderr


@pytest.mark.parametrize(
    ("environ", "found"),
    [
        ({"PYTORCH_ALLOC_CONF": "per_process_memory_fraction:0.3"}, 0.3),
        ({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True,per_process_memory_fraction:0.4"},
         0.4),
        # torch reads the deprecated name only when the new one is unset
        ({"PYTORCH_ALLOC_CONF": "expandable_segments:True",
          "PYTORCH_CUDA_ALLOC_CONF": "per_process_memory_fraction:0.4"}, None),
        ({"PYTORCH_ALLOC_CONF": "per_process_memory_fraction:0.2",
          "PYTORCH_CUDA_ALLOC_CONF": "per_process_memory_fraction:0.4"}, 0.2),
        ({"PYTORCH_ALLOC_CONF": "per_process_memory_fraction:lots"}, None),
        ({}, None),
    ],
)  # fmt: skip
def test_user_allocator_fraction_under_either_name(environ, found):
    seen = user_fraction(environ)
    assert (seen and seen[0]) == found
