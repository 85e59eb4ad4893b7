"""Placement: where jobs go on a cluster of GPU nodes, and a simulator that checks it at scale.

The simulator (`memgov queue simulate`, docs/placement.md) replays a trace with the policies of
the decision core (memgov/decide/), the same code and names the queue runs.
"""

from __future__ import annotations

from memgov.decide import Policy, choose
from memgov.decide.model import MILLI, Assignment, ClusterState, Demand, Node
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
    "load_nodes",
    "load_trace",
    "simulate",
]
