"""What Ray must be told for a task that needs N bytes of GPU memory (no ray import here).

Ray has no GPU-memory resource and its fractional GPUs are logical only. memgov turns a budget
into three requests that Ray can count exactly (docs/ray.md):

- ``num_gpus = budget / the GPU's capacity``, rounded UP to Ray's resource precision (1e-4):
  Ray packs per GPU and sets ``CUDA_VISIBLE_DEVICES`` to the GPU it picked; rounding up means
  Ray can never place more budgets on one GPU than its capacity holds;
- ``gpu_memory``: the budget in MiB (rounded up), a per-node total that `ray status` shows;
- ``memgov_gpu_<type>``: the same fraction of a per-type marker, so the task only lands on nodes
  whose GPUs have the capacity the fraction was computed for (mixed clusters).

A node declares ``num_gpus = G``, ``gpu_memory = G x capacity MiB`` and ``memgov_gpu_<type> = G``
(``memgov ray node-resources`` prints them); the type is the per-GPU capacity in whole MiB, the
ledger's capacity (total - reserve), e.g. ``memgov_gpu_16384MiB``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from memgov._base import settings as _settings
from memgov._base.errors import ConfigError
from memgov._base.sizes import Size, format_size, parse_size

MIB = 2**20
MEMORY_RESOURCE = "gpu_memory"
"""Per-node total of the GPUs' budget capacity, in MiB."""
TYPE_PREFIX = "memgov_gpu_"
_TYPE = re.compile(r"^memgov_gpu_(\d+)MiB$")
RAY_PRECISION = 10_000
"""Ray stores resource amounts in units of 1e-4."""


def type_resource(capacity_mib: int) -> str:
    """The marker resource of a GPU type: ``memgov_gpu_<capacity>MiB``."""
    return f"{TYPE_PREFIX}{capacity_mib}MiB"


def type_capacity(resource: str) -> int | None:
    """The per-GPU capacity in MiB a marker resource names; None for any other resource."""
    match = _TYPE.match(resource)
    return int(match.group(1)) if match else None


@dataclass(frozen=True)
class Request:
    """One task's GPU memory: the budget, and the GPU type it was sized against."""

    budget: int
    """Bytes the worker claims."""
    capacity_mib: int
    """The per-GPU capacity of the type (MiB)."""
    wait: float | None = None
    """Seconds the worker queues for its budget in the ledger; None fails at once."""
    job: str | None = None
    """The job the worker's run is recorded under (its profile sizes ``budget="auto"``)."""
    source: str = ""
    """Where an ``auto`` budget came from (one line), else empty."""

    @property
    def budget_mib(self) -> int:
        return -(-self.budget // MIB)

    @property
    def fraction(self) -> float:
        """``budget / capacity`` rounded up to Ray's precision: never over-packs a GPU."""
        units = math.ceil(self.budget_mib * RAY_PRECISION / self.capacity_mib)
        return units / RAY_PRECISION

    def resources(self) -> dict[str, float]:
        """Custom resources (the ``resources=`` of ray.remote and .options)."""
        return {
            MEMORY_RESOURCE: float(self.budget_mib),
            type_resource(self.capacity_mib): self.fraction,
        }

    def ray_options(self) -> dict[str, Any]:
        return {"num_gpus": self.fraction, "resources": self.resources()}

    def bundle(self, cpus: float) -> dict[str, float]:
        """One placement-group bundle / ``resources_per_worker`` dict (Tune, Train)."""
        return {"CPU": cpus, "GPU": self.fraction, **self.resources()}


def build(
    budget: int | str,
    gpu: int | str | None,
    known: list[int] | None,
    wait: float | None,
    job: str | None = None,
) -> Request:
    """The Request for ``budget`` on GPU type ``gpu`` (a size such as "16GiB", or a marker).

    ``known``: the per-GPU capacities (MiB) the cluster declares, or None when Ray is not
    initialised (then ``gpu`` must be given). A budget no GPU of the type can hold is refused
    here, so it is never submitted: Ray would otherwise round it to whole GPUs.
    """
    capacity = _pick_type(gpu, known, budget)
    seconds = _settings.wait_seconds(wait, "wait")
    if job is not None:
        job = _settings.job_name(job, "job")
    source = ""
    if isinstance(budget, str) and budget.strip().lower() == "auto":
        budget, source = auto_budget(job, capacity)
    where = f"GPUs of {capacity} MiB" if gpu is not None else "each GPU of the cluster"
    return Request(_budget_bytes(budget, capacity, where), capacity, seconds, job, source)


def auto_budget(job: str | None, capacity_mib: int) -> tuple[int, str]:
    """``budget="auto"`` in the driver (Ray needs a number before it schedules): the job's
    profile in this host's store (peak + 10 % + 64 MiB), else a first run of a quarter of the
    GPU type, which the worker's ledger still admits only where it is free."""
    from memgov._profiles import autosize as _autosize, store as _profiles

    if job is None:
        raise ConfigError(
            "budget='auto' needs job=NAME: the name the task's runs are recorded under, whose "
            "measured peaks size it (memgov.ray.remote names it after the function)"
        )
    profile = _profiles.read(job)
    found = None
    if profile is not None:
        found = _autosize.need(profile, False) or _autosize.need(profile, True)
    if found is not None:
        size = min(found[0], capacity_mib * MIB)
        return size, f"auto: {format_size(size)} = {found[1]}"
    size = int(capacity_mib * MIB * _autosize.FIRST_RUN_SHARE_OF_DEVICE) // MIB * MIB
    return size, (
        f"auto: {format_size(size)} = first run of {job}: a quarter of the "
        f"{capacity_mib:,} MiB GPU type (no profile yet)"
    )


def _budget_bytes(budget: int | str, capacity_mib: int, where: str) -> int:
    """``budget`` in bytes on a GPU of ``capacity_mib``, checked as every size is against its
    device (memgov._base.sizes.Size.on)."""
    size = Size(budget, "budget")
    try:
        return size.on(capacity_mib * MIB, where)
    except ConfigError as exc:  # a size: larger than the GPU; a percentage: 0 bytes
        never = "; it can never fit: a budget lives on one GPU, memgov never splits it"
        raise ConfigError(f"{exc}{never if size.percent is None else ''}") from None


def _pick_type(gpu: int | str | None, known: list[int] | None, budget: int | str) -> int:
    if gpu is not None:
        if isinstance(gpu, str) and type_capacity(gpu.strip()) is not None:
            capacity = type_capacity(gpu.strip())
            assert capacity is not None
        else:
            also = (
                "a GPU type's marker resource such as "
                f"'{type_resource(16384)}' (gpu= names a GPU type by its per-GPU capacity)"
            )
            capacity = parse_size(gpu, what="gpu", also=also) // MIB
        if known and capacity not in known:
            raise ConfigError(
                f"gpu={gpu!r} ({capacity} MiB): no node of this cluster declares that GPU type; "
                f"declared: {_listing(known)} (memgov ray node-resources prints them)"
            )
        return capacity
    if known is None:
        raise ConfigError(
            "gpu= is needed when Ray is not initialised yet: name the GPU type by its capacity "
            "(e.g. gpu='16GiB'), or call ray.init() first so memgov reads the cluster's types"
        )
    if not known:
        raise ConfigError(
            "no node of this Ray cluster declares memgov GPU resources; start each node with "
            "the flags `memgov ray node-resources` prints"
        )
    if len(known) == 1:
        return known[0]
    raise ConfigError(
        f"this cluster has several GPU types ({_listing(known)}); a Ray request cannot say "
        f"'any of them', so pass gpu= (e.g. gpu='{known[0]}MiB') for budget {budget!r}"
    )


def _listing(known: list[int]) -> str:
    return ", ".join(f"{c} MiB ({type_resource(c)})" for c in sorted(known))


def cluster_types(resources: dict[str, float]) -> list[int]:
    """The GPU capacities (MiB) declared in ``ray.cluster_resources()``."""
    found = {type_capacity(name) for name in resources}
    return sorted(c for c in found if c is not None)
