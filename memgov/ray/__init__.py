"""memgov on Ray: GPU memory as a resource Ray schedules and memgov enforces (docs/ray.md).

    import memgov.ray

    @memgov.ray.remote(budget="2GiB")                 # Ray packs it by memory; the task claims it
    def train(config): ...

    f.options(**memgov.ray.options("2GiB"))           # the scheduling half, for any remote
    tune.with_resources(memgov.ray.governed(fn, "1GiB"), memgov.ray.placement("1GiB"))
    ScalingConfig(num_workers=4, use_gpu=True, resources_per_worker=memgov.ray.resources("2GiB"))

Ray counts (``num_gpus`` = budget / GPU capacity, plus the ``gpu_memory`` and GPU-type
resources the nodes declare with ``memgov ray node-resources``); memgov enforces inside the worker
(a claim on the GPU Ray assigned, hard under MPS). Importing this module does not import Ray.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from typing import Any

from memgov.ray._node import cluster_status, node_resources
from memgov.ray._request import MEMORY_RESOURCE, Request, build, cluster_types, type_resource
from memgov.ray._worker import assigned_device, claim_assigned, governed

__all__ = [
    "MEMORY_RESOURCE",
    "Request",
    "assigned_device",
    "claim",
    "cluster_status",
    "governed",
    "node_resources",
    "options",
    "placement",
    "remote",
    "request",
    "resources",
    "type_resource",
]


def _known_types() -> list[int] | None:
    """The cluster's GPU capacities (MiB), or None when Ray is not initialised (or installed)."""
    try:
        import ray
    except ImportError:
        return None
    if not ray.is_initialized():
        return None
    return cluster_types(ray.cluster_resources())


def request(
    budget: int | str,
    *,
    gpu: int | str | None = None,
    wait: float | None = None,
    job: str | None = None,
) -> Request:
    """The Request for ``budget`` (bytes, "2GiB", "25%" of the GPU type, or "auto") on GPU
    type ``gpu``.

    ``gpu``: the per-GPU capacity of the type to run on ("16GiB", or a marker such as
    "memgov_gpu_16384MiB"); None takes the cluster's only type (after ray.init()).
    ``job``: the name the task's runs are recorded under; ``"auto"`` sizes from its profile
    (peak + 10 % + 64 MiB), else a first run of a quarter of the GPU type (docs/profiles.md).
    """
    return build(budget, gpu, _known_types(), wait, job)


def options(
    budget: int | str, *, gpu: int | str | None = None, job: str | None = None, **ray_options: Any
) -> dict[str, Any]:
    """Ray options for ``ray.remote(**opts)`` / ``f.options(**opts)``: the scheduling half.

    The task itself claims with ``memgov.ray.claim(budget)`` (or use ``memgov.ray.remote``,
    which does both). ``ray_options`` are merged (their ``resources`` too).
    """
    req = request(budget, gpu=gpu, job=job)
    merged = dict(ray_options)
    merged["num_gpus"] = req.fraction
    merged["resources"] = {**ray_options.get("resources", {}), **req.resources()}
    return merged


def resources(
    budget: int | str, *, gpu: int | str | None = None, cpus: float = 1
) -> dict[str, float]:
    """One worker's resources, e.g. ``ScalingConfig(resources_per_worker=...)`` of Ray Train."""
    return request(budget, gpu=gpu).bundle(cpus)


def placement(budget: int | str, *, gpu: int | str | None = None, cpus: float = 1) -> Any:
    """A ``PlacementGroupFactory`` of one bundle, for ``tune.with_resources(trainable, ...)``."""
    from ray.tune import PlacementGroupFactory

    return PlacementGroupFactory([resources(budget, gpu=gpu, cpus=cpus)])


def claim(
    budget: int | str,
    *,
    wait: float | None = None,
    name: str | None = None,
    job: str | None = None,
) -> Any:
    """Inside a task, actor or trial: claim ``budget`` on the GPU Ray assigned (never re-picked).

    Returns the memgov Claim (a context manager); raises BudgetExceeded when the ledger says the
    GPU has no room (someone outside Ray holds memory), after ``wait`` seconds if given.
    ``budget="auto"`` is sized on the node, as ``memgov.claim("auto")`` (docs/profiles.md).
    """
    return claim_assigned(budget, wait, name, job)


def remote(
    budget: int | str,
    *,
    gpu: int | str | None = None,
    wait: float | None = None,
    job: str | None = None,
    **ray_options: Any,
) -> Callable[[Any], Any]:
    """``@memgov.ray.remote(budget="2GiB")``: a Ray remote function or actor class that Ray
    schedules by GPU memory and that claims its budget on the assigned GPU.

    A function claims per call and releases when the call ends; an actor claims in its
    constructor and holds the budget for its life. Functions retry BudgetExceeded (the ledger had
    no room yet) up to ``max_retries`` (default 3) unless ``retry_exceptions`` is given. The Ray
    options are computed at the first ``.remote()`` when ``gpu`` is None and Ray is not up yet.
    ``budget="auto"``: sized from the job's profile (``job``, default ``ray:<module>.<name>``),
    else a first run of a quarter of the GPU type; the line saying which is printed once.
    """

    def wrap(target: Any) -> Any:
        return _LazyRemote(target, budget, gpu, wait, ray_options, job)

    return wrap


class _LazyRemote:
    """A Ray remote function or actor class built at first use (the cluster's types known)."""

    def __init__(
        self,
        target: Any,
        budget: int | str,
        gpu: int | str | None,
        wait: float | None,
        ray_options: dict[str, Any],
        job: str | None = None,
    ) -> None:
        self._target = target
        self._budget = budget
        self._gpu = gpu
        self._wait = wait
        self._ray_options = ray_options
        self._job = job or (
            None
            if not _is_auto(budget)
            else f"ray:{getattr(target, '__module__', '?')}."
            f"{getattr(target, '__qualname__', self.__class__.__name__)}"
        )
        self._built: Any = None
        self.__name__ = getattr(target, "__name__", "remote")
        self.__doc__ = getattr(target, "__doc__", None)

    def _remote(self) -> Any:
        if self._built is None:
            import ray

            req = request(self._budget, gpu=self._gpu, job=self._job)
            if req.source:
                import sys

                sys.stderr.write(f"memgov: {req.source}\n")
            opts = dict(self._ray_options)
            opts["num_gpus"] = req.fraction
            opts["resources"] = {**self._ray_options.get("resources", {}), **req.resources()}
            if inspect.isclass(self._target):
                body = _governed_class(self._target, req.budget, self._wait, req.job)
            else:
                body = governed(self._target, req.budget, self._wait, req.job)
                opts.setdefault("retry_exceptions", list(_retryable()))
                opts.setdefault("max_retries", 3)
                # Ray 2.60 gives GPU tasks max_calls=1, and a worker leaving after its one call
                # aborts now and then ("Mutex corrupt", SIGABRT; docs/ray.md): reuse workers.
                opts.setdefault("max_calls", 0)
            self._built = ray.remote(**opts)(body)
        return self._built

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        return self._remote().remote(*args, **kwargs)

    def options(self, **kwargs: Any) -> Any:
        return self._remote().options(**kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"{self.__name__} is a Ray remote; call {self.__name__}.remote(...)")


def _retryable() -> tuple[type[BaseException], ...]:
    from memgov._base.errors import BudgetExceeded

    return (BudgetExceeded,)


def _is_auto(budget: object) -> bool:
    return isinstance(budget, str) and budget.strip().lower() == "auto"


def _governed_class(
    cls: type, budget: int | str, wait: float | None, job: str | None = None
) -> type:
    """``cls`` whose instances claim in the constructor and hold the budget for their life."""
    original = cls.__init__  # type: ignore[misc]

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        held = claim_assigned(budget, wait, name=f"ray:{cls.__name__}:{os.getpid()}", job=job)
        try:
            original(self, *args, **kwargs)
        except BaseException:
            held.release()
            raise
        self.__memgov_claim__ = held  # released when the actor's process ends (flock)

    return type(
        cls.__name__,
        (cls,),
        {"__init__": __init__, "__qualname__": cls.__qualname__, "__module__": cls.__module__},
    )
