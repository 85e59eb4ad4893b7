"""Node side: the resources a node declares to ``ray start``, and ledger status across a cluster.

Ray cannot change a node's resource capacities after it starts, so the node declares its GPUs'
full budget capacity (the ledger's: total - reserve) and the ledger stays the truth about what is
free right now: memory someone outside Ray holds is found by the claim in the worker, which then
waits or raises (docs/ray.md).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from memgov.ray._request import MEMORY_RESOURCE, MIB, type_resource


def node_resources() -> dict[str, Any]:
    """``num_gpus``, ``resources`` (for ``ray start`` / ``Cluster.add_node``) and notes."""
    from memgov._base import config as _config
    from memgov._gpu.devices import devices

    found = devices()
    notes: list[str] = []
    if not found:
        return {"num_gpus": 0, "resources": {}, "gpus": [], "notes": ["no GPU on this node"]}
    capacities = [max(0, d.total - _config.reserve(d.total, d.simulated)) // MIB for d in found]
    capacity = min(capacities)
    if len(set(capacities)) > 1:
        # One node has one num_gpus pool: the fraction of a request is sized on one capacity,
        # so the smallest keeps every GPU of the node from being over-packed.
        notes.append(
            f"GPUs of different capacities on one node ({sorted(set(capacities))} MiB): all are "
            f"declared as the smallest ({capacity} MiB); the larger ones are under-used"
        )
    gpus = [
        {
            "index": d.index,
            "uuid": d.uuid,
            "name": d.name,
            "total": d.total,
            "capacity_mib": c,
            "simulated": d.simulated,
        }
        for d, c in zip(found, capacities, strict=True)
    ]
    return {
        "num_gpus": len(found),
        "resources": {MEMORY_RESOURCE: capacity * len(found), type_resource(capacity): len(found)},
        "gpus": gpus,
        "notes": notes,
    }


def ray_start_flags(declared: dict[str, Any]) -> str:
    """The ``ray start`` flags for ``declared`` (from node_resources()), in a form that survives
    the shell's word splitting unquoted, so ``ray start ... $(memgov ray node-resources)`` works:
    each flag is one word (``--flag=value``) and the JSON has no spaces. Quotes would not help:
    ``$(...)`` does not remove them. The resource names (gpu_memory, memgov_gpu_<N>MiB) hold no
    character a shell would glob on."""
    resources = json.dumps(declared["resources"], sort_keys=True, separators=(",", ":"))
    return f"--num-gpus={declared['num_gpus']} --resources={resources}"


def _node_status() -> dict[str, Any]:
    """Runs on one node (as a Ray task): its ledger status and declared resources."""
    import os
    import socket

    from memgov import _status

    try:
        data: dict[str, Any] = _status.status()
    except Exception as exc:  # one broken node must not hide the others
        data = {"devices": [], "error": f"{type(exc).__name__}: {exc}"}
    data["hostname"] = socket.gethostname()
    data["memgov_dir"] = os.environ.get("MEMGOV_DIR", "")
    return data


def cluster_status(address: str | None = None, timeout: float = 60.0) -> dict[str, Any]:
    """Ledger status of every alive node of the Ray cluster: one small task pinned per node."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if not ray.is_initialized():
        ray.init(address=address or "auto", logging_level=logging.ERROR, log_to_driver=False)
    probe = ray.remote(num_cpus=0, max_retries=0)(_node_status)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    refs = {
        n["NodeID"]: probe.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
        ).remote()
        for n in nodes
    }
    result = []
    for node in nodes:
        entry: dict[str, Any] = {
            "node_id": node["NodeID"],
            "address": node.get("NodeManagerAddress"),
            "resources": node.get("Resources", {}),
        }
        try:
            found: dict[str, Any] = ray.get(refs[node["NodeID"]], timeout=timeout)
            entry.update(found)
        except Exception as exc:
            entry.update({"devices": [], "error": f"{type(exc).__name__}: {exc}"})
        result.append(entry)
    return {"nodes": result}
