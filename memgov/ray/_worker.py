"""Inside a Ray worker: claim the budget on the GPU Ray assigned, release it when the task ends.

Ray picks the GPU (its fractional ``num_gpus`` packs per GPU) and sets ``CUDA_VISIBLE_DEVICES``;
memgov never re-picks: the claim goes to exactly that device, so the ledger and Ray agree on
where each budget lives. Where they disagree on how much is free (someone outside Ray holds
memory on the GPU, or Ray's logical count was told more than the card has), the ledger wins:
the claim waits (``wait=``) or raises BudgetExceeded, which Ray retries (``retry_exceptions``).

The claim's record is flock-held by the worker process, so a killed worker's budget is free at
the next admission (no heartbeat). Ray reuses worker processes between tasks: the claim is
released at the end of each call, and a later task in the same worker claims afresh. Frameworks
keep the caps of the first claim (torch's fraction can be lowered, never lifted, once CUDA is up),
so GPU tasks of different budgets are best run with ``max_calls=1`` (docs/ray.md).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any, TypeVar

from memgov._base.errors import NoDeviceError

F = TypeVar("F", bound=Callable[..., Any])


def assigned_gpu_ids() -> list[str]:
    """The GPU ids Ray assigned to this task or actor (strings), from Ray or the environment."""
    try:
        import ray

        if ray.is_initialized():
            return [str(i) for i in ray.get_gpu_ids()]
    except ImportError:
        pass
    raw = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    return [t.strip() for t in raw.split(",") if t.strip()]


def assigned_device() -> Any:
    """The memgov Device that Ray's assigned GPU is (never a re-pick).

    Real GPUs: Ray has set CUDA_VISIBLE_DEVICES to its choice, so the first GPU this process
    sees is the one. Simulated GPUs (MEMGOV_DEVICES, GPU-less CI): Ray's GPU id N is the Nth
    entry of the node's MEMGOV_DEVICES, as the node declared them with ``--num-gpus``.
    """
    from memgov._gpu import devices as _devices

    ids = assigned_gpu_ids()
    if not ids:
        raise NoDeviceError(
            "Ray assigned this task no GPU: request GPU memory through memgov.ray.options() / "
            "memgov.ray.remote(), whose num_gpus fraction makes Ray pick one"
        )
    if _devices.simulated_spec() is not None:
        found = _devices.devices()
        if not ids[0].isdigit() or int(ids[0]) >= len(found):
            raise NoDeviceError(
                f"Ray assigned GPU id {ids[0]!r}, but MEMGOV_DEVICES on this node lists "
                f"{len(found)} device(s); start the node with the --num-gpus that "
                "`memgov ray node-resources` prints"
            )
        return found[int(ids[0])]
    return _devices.candidates(None)[0]


def claim_assigned(
    budget: int | str, wait: float | None = None, name: str | None = None, job: str | None = None
) -> Any:
    """Claim ``budget`` on the GPU Ray assigned (its run recorded under ``job``); the Claim."""
    import memgov

    device = assigned_device()
    label = name or f"ray:{os.getpid()}"
    return memgov.claim(budget, device=device.uuid, wait=wait, name=label, job=job)


def governed(fn: F, budget: int | str, wait: float | None = None, job: str | None = None) -> F:
    """``fn`` with a claim around every call: taken before, released after, however it ends."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        label = f"ray:{getattr(fn, '__name__', 'task')}:{os.getpid()}"
        held = claim_assigned(budget, wait, name=label, job=job)
        try:
            return fn(*args, **kwargs)
        finally:
            held.release()

    call.__memgov_budget__ = budget  # type: ignore[attr-defined]
    return call  # type: ignore[return-value]
