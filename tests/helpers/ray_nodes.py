"""Simulated Ray nodes of the Ray tests (tests/ray, tests/queue/test_queue_ray.py)."""

from __future__ import annotations

import os
from typing import Any


def declared(env: dict[str, str]) -> dict[str, Any]:
    """``memgov.ray.node_resources()`` as a node started with ``env`` computes it; this process's
    own variables are put back afterwards."""
    import memgov.ray  # here: callers skip first where Ray is not installed

    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return memgov.ray.node_resources()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
