"""The queue on a Ray cluster of 3 simulated nodes (one host; tests/ray's layout): every job
lands on a GPU with room, none is over budget, and the report has the same figures."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")

import memgov.ray  # noqa: E402
from memgov._devices import simulated_devices  # noqa: E402
from memgov._ledger import DeviceLedger  # noqa: E402
from memgov.queue.onray import run_on_ray  # noqa: E402
from tests.helpers.queuejobs import GIB, write_queue  # noqa: E402

NODES = {"n16": "n16g0:16GiB", "n80": "n80g0:80GiB", "n2x16": "n2g0:16GiB,n2g1:16GiB"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    import os

    from ray.cluster_utils import Cluster

    base = tmp_path_factory.mktemp("ray-queue")
    ledgers = {name: base / name for name in NODES}
    made = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    try:
        for name, spec in NODES.items():
            env = {"MEMGOV_DEVICES": spec, "MEMGOV_DIR": str(ledgers[name])}
            saved = {k: os.environ.get(k) for k in env}
            os.environ.update(env)
            try:
                declared = memgov.ray.node_resources()
            finally:
                for key, value in saved.items():
                    if value is None:
                        os.environ.pop(key, None)
                    else:
                        os.environ[key] = value
            made.add_node(
                num_cpus=3,
                num_gpus=declared["num_gpus"],
                resources=declared["resources"],
                env_vars=env,
            )
        ray.init(address=made.address, logging_level="ERROR", log_to_driver=False)
        yield ledgers
    finally:
        ray.shutdown()
        made.shutdown()


class Watch(threading.Thread):
    """Every node's ledger, read under its lock: the most claimed, and any over-commit."""

    def __init__(self, ledgers: dict[str, Path]) -> None:
        super().__init__(daemon=True)
        self.ledgers = [
            DeviceLedger(d, root=ledgers[n])
            for n, spec in NODES.items()
            for d in simulated_devices(spec)
        ]
        self.most: dict[str, int] = {}
        self.over: list[str] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            for ledger in self.ledgers:
                if not ledger.path.is_dir():
                    continue
                with ledger.locked():
                    snap = ledger.scan(clean=False)
                uuid = ledger.device.uuid
                self.most[uuid] = max(self.most.get(uuid, 0), snap.claimed)
                if snap.claimed > snap.capacity:
                    self.over.append(f"{uuid}: {snap.claimed} > {snap.capacity}")
            time.sleep(0.02)


def claimer(seconds: float) -> list[str]:
    code = (
        "import os, time, memgov\n"
        "c = memgov.claim(int(os.environ['MEMGOV_CLAIM']), device=os.environ['MEMGOV_DEVICE'])\n"
        f"time.sleep({seconds})\n"
    )
    return [sys.executable, "-c", code]


@pytest.mark.parametrize("policy", ["memgov", "sjf-exclusive"])
def test_a_queue_runs_on_ray_every_job_on_a_gpu_with_room(
    cluster: dict[str, Path], tmp_path: Path, policy: str
) -> None:
    sizes = [4, 6, 8, 2, 12, 4, 30, 50, 3, 5]
    jobs: list[dict[str, Any]] = [
        {
            "name": f"j{i}",
            "cmd": claimer(0.3),
            "claim": f"{s}GiB",
            "kind": "big" if s > 16 else "small",
            "duration": 0.3,
        }
        for i, s in enumerate(sizes)
    ]
    path = write_queue(tmp_path / "q.toml", jobs)
    watch = Watch(cluster)
    watch.start()
    try:
        report = run_on_ray(path, "auto", policy=policy).to_json()
    finally:
        watch.done.set()
        watch.join(10)
    assert watch.over == []
    assert [j["end"] for j in report["jobs"]] == ["ok"] * len(sizes), report["jobs"]
    rows = {j["name"]: j for j in report["jobs"]}
    for i, size in enumerate(sizes):
        row = rows[f"j{i}"]
        assert row["claim_bytes"] >= size * GIB
        if size > 16:  # only the 80 GiB GPU holds it
            assert row["detail"].startswith("node") and row["claim_bytes"] <= 80 * GIB
    assert report["policy"] == policy and report["makespan_s"] > 0
    assert report["decisions"]["count"] == 1
    assert max(watch.most.values()) > 0  # the jobs' claims were in the nodes' ledgers
