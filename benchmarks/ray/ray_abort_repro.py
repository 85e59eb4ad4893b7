"""Ray 2.60 worker aborts ("Mutex corrupt", SIGABRT): with and without memgov, by max_calls.

    REPRO_MODE=sleep|wait|poll|none REPRO_MAX_CALLS=1|0 python benchmarks/ray/ray_abort_repro.py N

N tasks with num_gpus=0.1 on one simulated 16 GiB node (8 CPUs). Modes: none (sleep 0.3 s,
memgov not imported), sleep (random 0.2-3 s, memgov not imported), wait (memgov.claim("6GiB",
wait=30): the waiting path), poll (claim without wait, retried every 50 ms). Ray gives tasks
with num_gpus > 0 max_calls=1 by default: the worker exits after each task. Prints how many
worker logs of the session hold "Mutex corrupt", of all worker logs.
"""

from __future__ import annotations

import glob
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import ray
from ray.cluster_utils import Cluster


def job(i: int) -> float:
    mode = os.environ.get("REPRO_MODE", "wait")
    started = time.time()
    if mode == "none":
        time.sleep(0.3)
        return 0.0
    if mode == "sleep":
        time.sleep(random.uniform(0.2, 3.0))
        return 0.0
    import memgov

    if mode == "wait":
        held = memgov.claim("6GiB", wait=30, name=f"job{i}")
    else:
        while True:
            try:
                held = memgov.claim("6GiB", name=f"job{i}")
                break
            except memgov.BudgetExceeded:
                time.sleep(0.05)
    waited = time.time() - started
    time.sleep(0.3)
    held.release()
    return waited


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 16
    ledger = tempfile.mkdtemp(prefix="memgov-repro-")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    cluster.add_node(
        num_cpus=8, num_gpus=1, env_vars={"MEMGOV_DEVICES": "sim0:16GiB", "MEMGOV_DIR": ledger}
    )
    ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
    remote = ray.remote(
        num_gpus=0.1, max_retries=0, max_calls=int(os.environ.get("REPRO_MAX_CALLS", "1"))
    )(job)
    started = time.time()
    ok, errors = 0, []
    for ref in [remote.remote(i) for i in range(n)]:
        try:
            ray.get(ref)
            ok += 1
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {str(exc)[:300]}")
    logs = ray._private.worker._global_node.get_session_dir_path() + "/logs"
    workers = glob.glob(f"{logs}/worker-*.err")
    aborted = [w for w in workers if "Mutex corrupt" in Path(w).read_text(errors="replace")]
    print(
        json.dumps(
            {
                "mode": os.environ.get("REPRO_MODE", "wait"),
                "max_calls": os.environ.get("REPRO_MAX_CALLS", "1"),
                "tasks": n,
                "ok": ok,
                "failed": len(errors),
                "s": round(time.time() - started, 1),
                "workers": len(workers),
                "aborted": len(aborted),
                "errors": errors[:3],
            }
        )
    )
    ray.shutdown()
    cluster.shutdown()


if __name__ == "__main__":
    main()
