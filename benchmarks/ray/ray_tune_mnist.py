"""A Ray Tune sweep of the MNIST experiment, packed by GPU memory on a simulated 3-node cluster.

    python benchmarks/ray/ray_tune_mnist.py --out results/cpu-2core/2026-11-23-ray-tune

Nodes as in tests/ray (1x16 GiB, 1x80 GiB, 2x16 GiB, simulated with MEMGOV_DEVICES, one ledger
folder each). Each trial asks memgov.ray for 1 GiB on the 16 GiB GPU type (Ray packs it by
memory: 1/16 of a GPU), and runs experiments/mnist/train_torch.py (CPU, tiny epochs) with
MEMGOV_CLAIM=1GiB and MEMGOV_DEVICE set to the GPU Ray assigned, so the trainer's own auto-enable
claims on exactly that device. A thread samples every ledger while the sweep runs. Writes
OUT.json (trials, samples, cluster) and OUT.txt (the table).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
MNIST = REPO / "experiments" / "mnist"
NODES = {"n16": "n16g0:16GiB", "n80": "n80g0:80GiB", "n2x16": "n2g0:16GiB,n2g1:16GiB"}


def trial(config: dict[str, Any]) -> None:
    """One Tune trial: the MNIST trainer on the GPU Ray assigned, governed by its own claim."""
    from ray import tune

    import memgov.ray

    device = memgov.ray.assigned_device()
    env = dict(
        os.environ, MEMGOV_CLAIM=config["budget"], MEMGOV_DEVICE=device.uuid, OMP_NUM_THREADS="1"
    )
    env.pop("MEMGOV_HOLDER", None)
    argv = [
        sys.executable,
        "train_torch.py",
        "--device",
        "cpu",
        "--epochs",
        str(config["epochs"]),
        "--limit",
        str(config["limit"]),
        "--eval-limit",
        str(config["eval_limit"]),
        "--seed",
        str(config["seed"]),
        "--batch",
        str(config["batch"]),
    ]
    started = time.time()
    done = subprocess.run(
        argv, cwd=config["mnist"], env=env, capture_output=True, text=True, check=False
    )
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    final = next((e for e in events if e.get("event") == "done"), {})
    claim_line = next(
        (line for line in done.stderr.splitlines() if line.startswith("memgov: claim")), ""
    )
    tune.report(
        {
            "test_acc": final.get("test_acc"),
            "total_s": round(time.time() - started, 2),
            "exit": done.returncode,
            "device": device.uuid,
            "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "claim": claim_line,
            "node_dir": os.environ.get("MEMGOV_DIR"),
            "started": started,
            "error": "" if done.returncode == 0 else done.stderr[-400:],
        }
    )


def sample(
    nodes: dict[str, tuple[str, Path]], stop: threading.Event, out: list[dict[str, Any]]
) -> None:
    from memgov._gpu.devices import simulated_devices
    from memgov._ledger.ledger import DeviceLedger

    ledgers = [
        (name, DeviceLedger(d, root=root))
        for name, (spec, root) in nodes.items()
        for d in simulated_devices(spec)
    ]
    while not stop.is_set():
        for name, ledger in ledgers:
            with ledger.locked():
                snap = ledger.scan(clean=False)
            out.append(
                {
                    "t": time.time(),
                    "node": name,
                    "gpu": ledger.device.uuid,
                    "claims": len(snap.claims),
                    "claimed": snap.claimed,
                    "capacity": snap.capacity,
                }
            )
        time.sleep(0.2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="Path prefix of OUT.json and OUT.txt.")
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--budget", default="1GiB")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--limit", type=int, default=600)
    parser.add_argument("--eval-limit", type=int, default=500)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--cpus-per-node", type=int, default=4)
    args = parser.parse_args()

    import ray
    from ray import tune
    from ray.cluster_utils import Cluster

    import memgov.ray
    from memgov.ray._node import node_resources

    base = Path(tempfile.mkdtemp(prefix="memgov-ray-tune-"))
    nodes = {name: (spec, base / name) for name, spec in NODES.items()}
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    declared_by_node = {}
    for name, (spec, root) in nodes.items():
        env = {"MEMGOV_DEVICES": spec, "MEMGOV_DIR": str(root)}
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        declared = node_resources()
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
        declared_by_node[name] = {
            "num_gpus": declared["num_gpus"],
            "resources": declared["resources"],
        }
        cluster.add_node(
            num_cpus=args.cpus_per_node,
            num_gpus=declared["num_gpus"],
            resources=declared["resources"],
            env_vars=env,
        )
    ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
    samples: list[dict[str, Any]] = []
    stop = threading.Event()
    sampler = threading.Thread(target=sample, args=(nodes, stop, samples), daemon=True)
    sampler.start()
    started = time.time()
    try:
        tuner = tune.Tuner(
            tune.with_resources(trial, memgov.ray.placement(args.budget, gpu="16GiB")),
            param_space={
                "seed": tune.grid_search(list(range(args.trials))),
                "budget": args.budget,
                "epochs": args.epochs,
                "limit": args.limit,
                "eval_limit": args.eval_limit,
                "batch": args.batch,
                "mnist": str(MNIST),
            },
            run_config=tune.RunConfig(storage_path=str(base / "tune"), verbose=0),
        )
        grid = tuner.fit()
    finally:
        stop.set()
        sampler.join(5)
        wall = time.time() - started
    rows = []
    for result in grid:
        m = result.metrics or {}
        node = next((n for n, (_, root) in nodes.items() if str(root) == m.get("node_dir")), "?")
        rows.append(
            {
                "seed": result.config["seed"],
                "node": node,
                "gpu": m.get("device"),
                "cvd": m.get("cvd"),
                "test_acc": m.get("test_acc"),
                "total_s": m.get("total_s"),
                "exit": m.get("exit"),
                "claim": m.get("claim"),
                "error": m.get("error") or (str(result.error)[:400] if result.error else ""),
            }
        )
    rows.sort(key=lambda r: r["seed"])
    peak: dict[str, int] = {}
    peak_bytes: dict[str, int] = {}
    for s in samples:
        peak[s["gpu"]] = max(peak.get(s["gpu"], 0), s["claims"])
        peak_bytes[s["gpu"]] = max(peak_bytes.get(s["gpu"], 0), s["claimed"])
    request = memgov.ray.request(args.budget, gpu="16GiB")
    report = {
        "command": " ".join(sys.argv),
        "args": vars(args),
        "wall_s": round(wall, 1),
        "ray": ray.__version__,
        "request": request.bundle(1),
        "nodes": declared_by_node,
        "trials": rows,
        "peak_concurrent_claims": peak,
        "peak_claimed_bytes": peak_bytes,
        "ledger_samples": len(samples),
    }
    ray.shutdown()
    cluster.shutdown()
    Path(f"{args.out}.json").write_text(json.dumps(report, indent=1) + "\n")
    lines = [
        f"$ {report['command']}",
        f"Ray {ray.__version__}; {args.trials} trials x "
        f"{args.budget} on the 16 GiB GPU type; request per trial: {report['request']}",
        f"wall {report['wall_s']} s; ledger samples: {len(samples)}",
        "",
        f"{'seed':>4} {'node':6} {'gpu':6} {'CVD':>3} {'test_acc':>8} {'s':>6} exit  claim",
    ]
    for r in rows:
        acc = "-" if r["test_acc"] is None else f"{r['test_acc']:.3f}"
        lines.append(
            f"{r['seed']:>4} {r['node']:6} {r['gpu'] or '-':6} {r['cvd'] or '-':>3} "
            f"{acc:>8} {r['total_s'] or 0:>6} {r['exit']!s:>4}  {r['claim']}"
        )
        if r["error"]:
            lines.append(f"      error: {r['error']}")
    lines.append("")
    lines.append(
        "peak concurrent claims per GPU (ledger samples): "
        + ", ".join(f"{g}={n}" for g, n in sorted(peak.items()))
    )
    Path(f"{args.out}.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if all(r["exit"] == 0 for r in rows) and len(rows) == args.trials else 1


if __name__ == "__main__":
    sys.exit(main())
