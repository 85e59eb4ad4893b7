"""The queue on Ray on this machine's real GPUs: does each job run on the GPU its policy chose?

One Ray node (this host, its GPUs declared as `memgov ray node-resources` says) and a queue of
torch jobs placed by a policy that spreads them, the highest GPU index first (Ray's own count
would pack a node's first GPU). Each job writes what it saw (CUDA_VISIBLE_DEVICES,
MEMGOV_DEVICE, the UUID of torch's cuda:0) and allocates 1 GiB under its budget. Checked: the
report's GPU for each job is the policy's choice, that GPU's UUID is MEMGOV_DEVICE, and torch's
cuda:0 is that GPU. Meaningful on a machine of 2+ GPUs (on one, Ray's GPU is the policy's).
Usage: python3 benchmarks/gpu/queue_ray.py OUT_DIR [JOBS]
"""

from __future__ import annotations

import json
import logging
import sys
import tempfile
from pathlib import Path
from typing import Any

JOB = """
import json, os, sys, time
seen = {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "MEMGOV_DEVICE", "MEMGOV_CLAIM")}
try:
    import torch  # auto-enable claims MEMGOV_CLAIM on MEMGOV_DEVICE here (MEMGOV_WAIT)
    cuda = torch.cuda.is_available()
except ImportError:
    cuda = False
if cuda:
    x = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    seen["torch_uuid"] = "GPU-" + str(torch.cuda.get_device_properties(0).uuid)
else:  # a CPU machine (simulated GPUs): claim as auto-enable would
    import memgov
    if memgov.current() is None:  # torch's import claimed already where torch is installed
        c = memgov.claim(int(os.environ["MEMGOV_CLAIM"]), device=os.environ["MEMGOV_DEVICE"],
                         wait=float(os.environ["MEMGOV_WAIT"]))
    seen["torch_uuid"] = None
open(sys.argv[1], "w").write(json.dumps(seen))
time.sleep(4)
"""


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "out")
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 6
    out.mkdir(parents=True, exist_ok=True)
    try:
        import ray
    except ImportError:
        print("queue_ray: Ray is not installed here (pip install 'ray[default]'): nothing run")
        return 2
    import numpy as np

    from memgov.decide.policies import Fifo
    from memgov.queue import engine
    from memgov.queue.onray import run_on_ray
    from memgov.ray import node_resources

    class Spread(Fifo):
        """fifo, on the GPU with the fewest jobs: every GPU of the node gets some."""

        name = "spread"

        def __init__(self) -> None:
            self.chosen: dict[int, int] = {}

        def rank(self, job: Any, gpus: Any, book: Any) -> Any:
            return -np.array([len(book.kinds_on(g)) for g in gpus], dtype=float)

    placing = engine.place

    def recorded(policy: Any, view: Any) -> list[tuple[int, int]]:
        placed = placing(policy, view)
        policy.chosen.update(placed)
        return placed

    engine.place = recorded  # where the decision core put each job, to check where it ran

    declared = node_resources()
    ray.init(
        num_cpus=max(4, count),
        num_gpus=declared["num_gpus"],
        resources=declared["resources"],
        logging_level=logging.ERROR,
        log_to_driver=False,
    )
    script = Path(tempfile.mkdtemp()) / "job.py"
    script.write_text(JOB)
    lines = []
    for i in range(count):
        cmd = [sys.executable, str(script), str(out / f"j{i}.json")]
        lines += ["[[job]]", f'name = "j{i}"', f"cmd = {json.dumps(cmd)}", 'claim = "3GiB"', ""]
    queue = out / "queue_ray.toml"
    queue.write_text("\n".join(lines))
    policy = Spread()
    try:
        report = run_on_ray(queue, "local", policy=policy).to_json()
    finally:
        ray.shutdown()
    (out / "queue_ray_report.json").write_text(json.dumps(report, indent=1))
    uuids = {d["index"]: d["uuid"] for d in report["devices"]}
    bad = 0
    for number, row in enumerate(report["jobs"], 1):
        seen_path = out / f"{row['name']}.json"
        seen = json.loads(seen_path.read_text()) if seen_path.exists() else {}
        chosen = policy.chosen.get(number)
        good = (
            row["end"] == "ok"
            and row["gpu"] == chosen
            and seen.get("MEMGOV_DEVICE") == uuids.get(chosen)
            and seen.get("torch_uuid") in (None, uuids.get(chosen))
        )
        bad += not good
        print(
            f"{'PASS' if good else 'FAIL'} {row['name']}: end {row['end']}, policy chose gpu "
            f"{chosen}, ran on {row['gpu']}, saw {seen}"
        )
    print(
        f"queue_ray: {count - bad}/{count} jobs on the GPU their policy chose; "
        f"GPUs used {sorted(set(policy.chosen.values()))} of {sorted(uuids)}"
    )
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
