"""Garbage in every variable auto mode reads (every row of memgov's settings table and every GPU
scheduler variable): one warning line naming it (auto) or a ConfigError naming it (strict)."""

from __future__ import annotations

import pytest

# variable, garbage, text the message must contain (the variable and what is accepted)
GARBAGE = [
    ("MEMGOV_CLAIM", "lots", "MEMGOV_CLAIM='lots': accepted a size"),
    ("MEMGOV_WAIT", "soon", "MEMGOV_WAIT='soon': accepted seconds"),
    ("MEMGOV_DIR", "relative/ledger", "MEMGOV_DIR='relative/ledger' must be an absolute path"),
    ("MEMGOV_THREADS", "many", "MEMGOV_THREADS='many': accepted auto"),
    ("MEMGOV_DEVICE", "7", "MEMGOV_DEVICE='7': device='7': this process sees 1 GPU(s)"),
    ("MEMGOV_QUIET", "maybe", "MEMGOV_QUIET='maybe': accepted 1/true/yes/on"),
    ("MEMGOV_GC_FREEZE", "sometimes", "MEMGOV_GC_FREEZE='sometimes': accepted 1/true/yes/on"),
    ("MEMGOV_VIEWS", "maybe", "MEMGOV_VIEWS='maybe': accepted 1/true/yes/on"),
    ("MEMGOV_DEVICES", "sim0", "MEMGOV_DEVICES item 'sim0' is not valid; MEMGOV_DEVICES: accepted"),
    ("MEMGOV_RESERVE", "plenty", "MEMGOV_RESERVE: cannot read 'plenty' as a size; accepted"),
    (
        "MEMGOV_CLAIM",
        "999TiB",
        "MEMGOV_CLAIM: '999TiB' (1022976.00 GiB) is larger than the device "
        "sim0 (16.00 GiB); accepted at most 16.00 GiB or a percentage of the device sim0",
    ),
    # Settings this run would not use are checked too (a typo shows before the day it matters).
    ("MEMGOV_CONTEXTS", "0", "MEMGOV_CONTEXTS='0': accepted a whole number >= 1"),
    ("MEMGOV_MPS", "on", "MEMGOV_MPS='on': accepted auto"),
    ("MEMGOV_MPS_CLIENTS", "-3", "MEMGOV_MPS_CLIENTS='-3': accepted a whole number >= 1"),
    ("MEMGOV_MPS_POLICY", "random", "MEMGOV_MPS_POLICY='random': accepted fill"),
    ("MEMGOV_SHARD_SIZE", "big", "MEMGOV_SHARD_SIZE: cannot read 'big' as a size; accepted"),
    ("MEMGOV_TORCH_MARGIN", "10%", "MEMGOV_TORCH_MARGIN='10%': accepted a size"),
    ("MEMGOV_JOB", "j" * 129, "': accepted a job name of 1 to 128 printable characters"),
    ("MEMGOV_GIVE_BACK", "soon", "MEMGOV_GIVE_BACK='soon': accepted seconds > 0"),
    ("CUDA_DEVICE_MEMORY_LIMIT", "4 gigs", "HAMi CUDA_DEVICE_MEMORY_LIMIT='4 gigs': accepted"),
    ("CUDA_DEVICE_MEMORY_LIMIT_0", "-1", "HAMi CUDA_DEVICE_MEMORY_LIMIT_0='-1': accepted"),
    ("ALIYUN_COM_GPU_MEM_CONTAINER", "half", "ALIYUN_COM_GPU_MEM_CONTAINER='half': accepted"),
    ("GPU_PORTION", "big", "KAI scheduler GPU_PORTION='big': accepted the share of one GPU"),
    ("NVIDIA_GPU_MEMORY_LIMIT", "8Gi", "NVIDIA_GPU_MEMORY_LIMIT='8Gi': accepted a whole number"),
    (
        "NVIDIA_GPU_MEMORY_REQUEST",
        "8",
        "NVIDIA_GPU_MEMORY_REQUEST='8' (request, its soft limit) is 8388608 bytes, below 64 MiB",
    ),
    ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "2G", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT='2G': item '2G'"),
    ("SLURM_SHARDS_ON_NODE", "some", "Slurm SLURM_SHARDS_ON_NODE='some': accepted a whole number"),
    ("SLURM_SHARDS_ON_NODE", "4", "set MEMGOV_SHARD_SIZE (e.g. MEMGOV_SHARD_SIZE=4GiB)"),
]
SCHEDULER = ("CUDA_", "ALIYUN", "GPU_", "NVIDIA_GPU_", "SLURM")

PROGRAM = "import jax\nprint('survived')"


def test_every_user_setting_of_the_table_is_tried() -> None:
    from memgov._base import settings as _settings

    tried = {var for var, _, _ in GARBAGE} | {"MEMGOV_STRICT"}  # its own test, below
    assert set(_settings.names(internal=False)) <= tried


def prepared(env: dict[str, str], var: str, value: str) -> dict[str, str]:
    env[var] = value
    if not var.startswith(SCHEDULER) and var != "MEMGOV_CLAIM":
        env["MEMGOV_CLAIM"] = "1GiB"
    return env


@pytest.mark.parametrize(("var", "value", "message"), GARBAGE)
def test_auto_mode_warns_once_and_runs(env, py, var, value, message):
    result = py(PROGRAM, prepared(env, var, value))
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "survived"
    warnings = [line for line in result.stderr.splitlines() if line.startswith("memgov: warning")]
    assert len(warnings) == 1, result.stderr
    assert message in warnings[0]


@pytest.mark.parametrize(("var", "value", "message"), GARBAGE)
def test_strict_mode_raises_a_clear_error(env, py, var, value, message):
    env["MEMGOV_STRICT"] = "1"
    result = py(PROGRAM, prepared(env, var, value))
    assert result.returncode != 0
    assert "survived" not in result.stdout
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("memgov.ConfigError: "), result.stderr[-3000:]
    assert message in last


def test_garbage_strict_flag_warns_and_runs_unstrict(env, py):
    env.update(MEMGOV_STRICT="maybe", MEMGOV_CLAIM="lots")
    result = py(PROGRAM, env)
    assert result.returncode == 0 and result.stdout.strip() == "survived"
    warnings = [line for line in result.stderr.splitlines() if line.startswith("memgov: warning")]
    assert len(warnings) == 2  # MEMGOV_STRICT itself, then MEMGOV_CLAIM
    assert "MEMGOV_STRICT='maybe': accepted 1/true/yes/on" in warnings[0]
