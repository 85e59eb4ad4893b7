"""The job queue's metrics: a hook, empty until memgov has a job queue.

memgov has no job queue yet (`memgov pack` keeps its pending jobs in its own process, and the
ledger's admission queue is shown by ``memgov_admission_waiting``). When a queue lands, this is
where its families go, read from its own durable state as the ledger's are, never invented:
``memgov_queue_jobs{state="pending|running|done"}`` (gauge) and ``memgov_queue_oom_reruns_total``
(counter). docs/metrics.md lists them as not served yet.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric


def job_queue_families() -> Iterator[Metric]:
    """No job queue exists: nothing to yield (no placeholder values)."""
    yield from ()
