"""Placement: where jobs go on a cluster of GPU nodes, and a simulator that checks it at scale.

The queue (`memgov queue`) and the simulator (`memgov queue simulate`, docs/placement.md) share
these policies, found by name. Needs numpy (``pip install "memgov-gpu[placement]"``).
"""

from __future__ import annotations

from memgov.placement.model import MILLI, Assignment, ClusterState, Demand, Node
from memgov.placement.policies import Policy, choose, get_policy, policy_names
from memgov.placement.simulate import Result, arrivals, simulate
from memgov.placement.trace import TraceError, load_nodes, load_trace

__all__ = [
    "MILLI",
    "Assignment",
    "ClusterState",
    "Demand",
    "Node",
    "Policy",
    "Result",
    "TraceError",
    "arrivals",
    "choose",
    "get_policy",
    "load_nodes",
    "load_trace",
    "policy_names",
    "simulate",
]
