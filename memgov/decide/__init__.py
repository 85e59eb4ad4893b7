"""The decision core: one policy interface and one registry of policies by name, for every tool
that decides where jobs go: the queue (`memgov queue run`/`serve`), `memgov pack`, the Ray driver
and the trace simulator (`memgov queue simulate`). Each name means one algorithm everywhere
(memgov/decide/policies.py); one decision (memgov/decide/core.py) places a host's jobs with the
same scoring and choice the simulator replays on a cluster (docs/queue.md, docs/placement.md).
Needs numpy.
"""

from __future__ import annotations

from memgov.decide.core import choose, effective, place
from memgov.decide.learn import Learned
from memgov.decide.model import MILLI, Assignment, ClusterState, Demand, Node
from memgov.decide.policies import DEFAULT, POLICIES, Policy, get, names, resolve
from memgov.decide.view import Candidate, Gate, Gpu, Placement, Running, View

__all__ = [
    "DEFAULT",
    "MILLI",
    "POLICIES",
    "Assignment",
    "Candidate",
    "ClusterState",
    "Demand",
    "Gate",
    "Gpu",
    "Learned",
    "Node",
    "Placement",
    "Policy",
    "Running",
    "View",
    "choose",
    "effective",
    "get",
    "names",
    "place",
    "resolve",
]
