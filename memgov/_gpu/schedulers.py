"""Budgets that GPU schedulers hand to a container through environment variables.

memgov reads them so that a job under HAMi, Alibaba gpushare, KAI, the NVIDIA container toolkit,
NVIDIA MPS or Slurm shards needs no memgov setting at all. Where the limit is enforced below
memgov (HAMi-core's CUDA interception, the driver), memgov's budget sits a margin below it, so the
framework's own cap fails cleanly (a Python OutOfMemoryError) before the driver or interposer does.

| source | variable | read as |
|---|---|---|
| HAMi, KAI's HAMi plugin | CUDA_DEVICE_MEMORY_LIMIT_<i>, CUDA_DEVICE_MEMORY_LIMIT | "1g", bytes |
| Alibaba gpushare | ALIYUN_COM_GPU_MEM_CONTAINER / ALIYUN_COM_GPU_MEM_DEV | share x real total |
| KAI scheduler | GPU_PORTION (else the deprecated RUNAI_NUM_OF_GPUS) | fraction x real total |
| NVIDIA container toolkit | NVIDIA_GPU_MEMORY_LIMIT(S), NVIDIA_GPU_MEMORY_REQUEST(S) | whole MiB |
| NVIDIA MPS | CUDA_MPS_PINNED_DEVICE_MEM_LIMIT | "0=1G,1=2G", our device's entry |
| Slurm shards | SLURM_SHARDS_ON_NODE x MEMGOV_SHARD_SIZE | shards x site setting |

Where each comes from (checked in the projects' own code):
- KAI (NVIDIA/KAI-Scheduler, pkg/binder/common/gpu_access.go): the binder sets GPU_PORTION and,
  for compatibility, RUNAI_NUM_OF_GPUS to the pod's share of one GPU, formatted "%.2f"
  (pkg/scheduler/cache/cache.go), also for a `gpu-memory` request; KAI itself enforces nothing
  ("KAI Scheduler does not enforce memory allocation limit", docs/gpu-sharing). It sets no
  GPU_MEMORY_LIMIT, which memgov no longer reads. A portion of 1 or more is whole GPUs: no budget.
- NVIDIA container toolkit (apply-cuda-memory-limits CDI hook): reads NVIDIA_GPU_MEMORY_REQUESTS,
  else NVIDIA_GPU_MEMORY_REQUEST, and NVIDIA_GPU_MEMORY_LIMITS, else NVIDIA_GPU_MEMORY_LIMIT, whole
  MiB, for every GPU of the container; the driver enforces the limit (hard: allocations fail) and
  the request is the soft limit (guaranteed; above it a client may be evicted under contention).
  memgov budgets the request when there is one (the smallest budget wins), else the limit less
  the margin.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from memgov._base import settings as _settings
from memgov._base.sizes import format_size

MARGIN_FRACTION = 0.05
MARGIN_MIN = 64 * 2**20
"""Below an enforced limit, memgov's budget keeps max(5 %, 64 MiB) free: room for allocations the
framework cap does not see (CUDA context growth, library workspaces) before the hard limit."""

MIN_LIMIT = 64 * 2**20
"""A limit below this is taken as a unit mistake (e.g. GiB written where bytes are read)."""

_UNIT = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
_HAMI = re.compile(r"^\s*(\d+)\s*([kKmMgGtT]?)\s*$")
_MPS_ITEM = re.compile(r"^\s*(\d+)\s*=\s*(\d+)\s*([kKmMgGtT]?)[bB]?\s*$")

HAMI_ACCEPTED = (
    'accepted a whole number with an optional unit k, m or g ("1024m", "1g", "1048576k") or bytes'
)
MPS_ACCEPTED = 'accepted a comma-separated list of DEVICE=LIMIT, e.g. "0=1G,1=2048M"'


@dataclass(frozen=True)
class EnvBudget:
    """One budget found in the environment."""

    bytes: int
    """The budget memgov uses: ``limit``, less the margin where the limit is enforced."""
    limit: int
    """What the variable says, in bytes."""
    source: str
    """Human-readable origin, e.g. "HAMi CUDA_DEVICE_MEMORY_LIMIT_0='2g'"."""
    variable: str
    enforced: bool
    """True when something below memgov enforces ``limit`` (HAMi-core, the MPS driver)."""


@dataclass
class Reading:
    """Every scheduler budget in the environment for one device, and what could not be read."""

    budgets: list[EnvBudget] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def chosen(self) -> EnvBudget | None:
        """The budget to use: the smallest, since every one of them is a limit."""
        return min(self.budgets, key=lambda b: b.bytes) if self.budgets else None


def below_enforced(limit: int) -> int:
    return max(1, limit - max(int(limit * MARGIN_FRACTION), MARGIN_MIN))


def read(total: int, index: int | None, environ: Mapping[str, str] | None = None) -> Reading:
    """The scheduler budgets for the device of ``total`` bytes at CUDA ordinal ``index``.

    ``index`` is the device's position among the GPUs this process sees (HAMi's ``_<i>`` suffix
    and MPS's ``i=`` entries count the same way); None reads only device-independent variables.
    """
    env = os.environ if environ is None else environ
    found = Reading()
    readers = (_hami, _aliyun, _kai, _toolkit_limit, _toolkit_request, _mps, _slurm)
    for reader in readers:
        try:
            budget = reader(env, total, index)
        except ValueError as exc:
            found.problems.append(str(exc))
            continue
        if budget is None:
            continue
        if budget.limit < MIN_LIMIT:
            found.problems.append(
                f"{budget.source} is {budget.limit} bytes, below {format_size(MIN_LIMIT)}: "
                "taken as a unit mistake and ignored"
            )
            continue
        if budget.limit > total:
            budget = EnvBudget(
                total if not budget.enforced else below_enforced(total),
                total,
                budget.source + f" (more than the device's {format_size(total)})",
                budget.variable,
                budget.enforced,
            )
        found.budgets.append(budget)
    return found


def _value(env: Mapping[str, str], name: str) -> str | None:
    raw = env.get(name)
    return raw if raw is not None and raw.strip() else None


def _make(limit: int, source: str, variable: str, enforced: bool) -> EnvBudget:
    budget = below_enforced(limit) if enforced else limit
    return EnvBudget(budget, limit, source, variable, enforced)


def _hami(env: Mapping[str, str], total: int, index: int | None) -> EnvBudget | None:
    # HAMi-core reads the per-device variable first and falls back to the one for all devices.
    names = ([f"CUDA_DEVICE_MEMORY_LIMIT_{index}"] if index is not None else []) + [
        "CUDA_DEVICE_MEMORY_LIMIT"
    ]
    for name in names:
        raw = _value(env, name)
        if raw is None:
            continue
        match = _HAMI.match(raw)
        if not match:
            raise ValueError(f"HAMi {name}={raw!r}: {HAMI_ACCEPTED}")
        limit = int(match[1]) * _UNIT[match[2].lower()]
        return _make(limit, f"HAMi {name}={raw!r}", name, enforced=True)
    return None


def _whole(env: Mapping[str, str], name: str, who: str, accepted: str) -> tuple[str, int] | None:
    """``name``'s value and whole number >= 1, None if unset; else ``who``'s ValueError."""
    raw = _value(env, name)
    if raw is None:
        return None
    if not raw.strip().isdigit() or int(raw) <= 0:
        raise ValueError(f"{who} {name}={raw!r}: accepted {accepted}")
    return raw, int(raw)


def _aliyun(env: Mapping[str, str], total: int, index: int | None) -> EnvBudget | None:
    name, dev_name = "ALIYUN_COM_GPU_MEM_CONTAINER", "ALIYUN_COM_GPU_MEM_DEV"
    who = "Alibaba gpushare"
    units = f"a whole number of memory units (GiB by default), with {dev_name} the device's"
    found = _whole(env, name, who, f"{units} total in the same unit")
    if found is None:
        return None
    raw, share = found
    dev = _whole(
        env, dev_name, who, f"the device's total memory as a whole number in the unit of {name}"
    )
    if dev is None:
        # Without the device total the unit is unknown; gpushare's default unit is GiB.
        return _make(share * 2**30, f"{who} {name}={raw!r} (GiB assumed)", name, False)
    dev_raw, dev_total = dev
    limit = total * min(share, dev_total) // dev_total
    return _make(limit, f"{who} {name}={raw!r} of {dev_name}={dev_raw!r}", name, False)


def _kai(env: Mapping[str, str], total: int, index: int | None) -> EnvBudget | None:
    for name in ("GPU_PORTION", "RUNAI_NUM_OF_GPUS"):  # the second: KAI's deprecated name
        raw = _value(env, name)
        if raw is None:
            continue
        portion = _settings.positive_number(raw)
        if portion is None:
            raise ValueError(
                f"KAI scheduler {name}={raw!r}: accepted the share of one GPU, a number above 0 "
                '(e.g. "0.50"; 1 or more means whole GPUs)'
            )
        if portion >= 1:
            return None  # whole GPUs: the scheduler gives no memory budget
        return _make(int(total * portion), f"KAI scheduler {name}={raw!r}", name, False)
    return None


def _toolkit(env: Mapping[str, str], names: tuple[str, str], enforced: bool) -> EnvBudget | None:
    for name in names:  # the plural first, as the toolkit's hook reads them
        raw = _value(env, name)
        if raw is None:
            continue
        if not raw.strip().isdigit():
            raise ValueError(
                f"NVIDIA container toolkit {name}={raw!r}: accepted a whole number of MiB"
            )
        kind = "hard limit" if enforced else "request, its soft limit"
        source = f"NVIDIA container toolkit {name}={raw!r} ({kind})"
        return _make(int(raw) * 2**20, source, name, enforced)
    return None


def _toolkit_limit(env: Mapping[str, str], total: int, index: int | None) -> EnvBudget | None:
    return _toolkit(env, ("NVIDIA_GPU_MEMORY_LIMITS", "NVIDIA_GPU_MEMORY_LIMIT"), True)


def _toolkit_request(env: Mapping[str, str], total: int, index: int | None) -> EnvBudget | None:
    return _toolkit(env, ("NVIDIA_GPU_MEMORY_REQUESTS", "NVIDIA_GPU_MEMORY_REQUEST"), False)


def _mps(env: Mapping[str, str], total: int, index: int | None) -> EnvBudget | None:
    name = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
    raw = _value(env, name)
    if raw is None:
        return None
    limits: dict[int, int] = {}
    for item in raw.split(","):
        if not item.strip():
            continue
        match = _MPS_ITEM.match(item)
        if not match:
            raise ValueError(f"NVIDIA MPS {name}={raw!r}: item {item.strip()!r}; {MPS_ACCEPTED}")
        limits[int(match[1])] = int(match[2]) * _UNIT[match[3].lower()]
    if index is None or index not in limits:
        return None  # no limit for our device
    return _make(limits[index], f"NVIDIA MPS {name}={raw!r} (device {index})", name, True)


def _slurm(env: Mapping[str, str], total: int, index: int | None) -> EnvBudget | None:
    name, size_name = "SLURM_SHARDS_ON_NODE", "MEMGOV_SHARD_SIZE"
    found = _whole(env, name, "Slurm", "a whole number of shards >= 1")
    if found is None:
        return None
    raw, shards = found
    size_raw = _value(env, size_name)
    if size_raw is None:
        raise ValueError(
            f"Slurm {name}={raw!r} gives a number of shards, but how much GPU memory one shard "
            f"is, is a site setting: set {size_name} (e.g. {size_name}=4GiB) or MEMGOV_CLAIM"
        )
    shard = _settings.get(size_name, env).on(total)  # ConfigError (a ValueError) names it
    source = f"Slurm {name}={raw!r} x {size_name}={size_raw!r}"
    return _make(shards * shard, source, name, False)
