"""Which thread setting does each runtime honour? Threads per process, counted in /proc/self/task.

For each framework and setting, a fresh interpreter imports the framework, runs a CPU workload
(1500x1500 matmuls) and reports: the OS threads of the process after import and after the work,
the threads that did >= 10 % of the work's CPU time (a count that does not change when other
load shares the cores), and the framework's own setting where it has one.

    python benchmarks/cpu/threads_honoured.py [--frameworks torch,tensorflow,jax,numpy]

Settings: framework defaults; OMP_NUM_THREADS=1; MEMGOV_CLAIM=1GiB with one governed neighbour
(memgov's share: cores / 2); MEMGOV_CLAIM=1GiB with MEMGOV_THREADS=1; taskset -c 0 (affinity).
Simulated GPU (MEMGOV_DEVICES) and a private ledger: runs on a CPU machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))  # bench.py
from bench import THREAD_TICKS

TICKS = (
    THREAD_TICKS
    + """
import json
def report(setting, after_import):
    before = ticks()
    for _ in range(REPEAT):
        work()
    busy_threads = busy(before)
    tasks = len(os.listdir("/proc/self/task"))
    print(json.dumps({"after_import": after_import, "after_work": tasks,
                      "busy": busy_threads, "setting": setting}))
"""
)


def workload(imports: str, setup: str, repeat: int, setting: str = '"-"') -> str:
    """A fresh interpreter's program: IMPORTS, the threads counted, SETUP (it defines work()), one
    warm-up run, then REPEAT runs reported with SETTING (a Python expression)."""
    return (
        f'\nimport {imports}\nafter_import = len(os.listdir("/proc/self/task"))\n{setup}\n'
        f"REPEAT = {repeat}\nwork()\nreport({setting}, after_import)\n"
    )


NUMPY = "x = np.random.rand(1500, 1500)\ndef work(): float((x @ x).sum())"
WORK = {
    "torch": workload(
        "torch",
        "x = torch.randn(1500, 1500)\ndef work(): (x @ x).sum().item()",
        20,
        'f"get_num_threads={torch.get_num_threads()}"',
    ),
    "tensorflow": workload(
        "tensorflow as tf",
        "x = tf.random.normal((1500, 1500))\ndef work(): float(tf.reduce_sum(tf.matmul(x, x)))",
        20,
        'f"intra_op={tf.config.threading.get_intra_op_parallelism_threads()}"',
    ),
    "jax": workload(
        "jax, jax.numpy as jnp",
        "f = jax.jit(lambda a: jnp.tanh(a @ a).sum())\nx = jnp.ones((1500, 1500))\n"
        "def work(): f(x).block_until_ready()",
        20,
    ),
    # numpy's OpenBLAS pool is sized when numpy loads; memgov claims as the first torch/tf/jax
    # import begins, so the order matters: numpy first (its pool already made), or torch first
    # (torch loads numpy after the claim).
    "numpy (torch first)": workload("torch, numpy as np", NUMPY, 10),
    "numpy (numpy first)": workload("numpy as np, torch", NUMPY, 10),
}

NEIGHBOUR = "import sys, memgov; memgov.claim('1GiB'); print('ready', flush=True); sys.stdin.read()"


def settings() -> list[tuple[str, dict[str, str], list[str]]]:
    governed = {"MEMGOV_CLAIM": "1GiB"}
    return [
        ("default", {}, []),
        ("OMP_NUM_THREADS=1", {"OMP_NUM_THREADS": "1"}, []),
        ("MEMGOV_CLAIM, 1 neighbour", governed, []),
        ("MEMGOV_CLAIM, MEMGOV_THREADS=1", {**governed, "MEMGOV_THREADS": "1"}, []),
        ("taskset -c 0", {}, ["taskset", "-c", "0"]),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frameworks", default=",".join(WORK))
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args()
    ledger = tempfile.mkdtemp(prefix="memgov-threads-honoured-")
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("MEMGOV_", "OMP_", "MKL_", "OPENBLAS_", "XLA_"))
    }
    base.update(
        MEMGOV_DIR=ledger,
        MEMGOV_DEVICES="sim0:16GiB",
        TF_CPP_MIN_LOG_LEVEL="3",
        JAX_PLATFORMS="cpu",
    )
    print(
        f"cores in the affinity mask: {len(os.sched_getaffinity(0))}; load average at start: "
        f"{os.getloadavg()}"
    )
    print(
        f"{'framework':22} {'setting':32} {'threads after import':>20} {'after work':>10} "
        f"{'busy':>5}  framework's setting"
    )
    rows = []
    neighbour = subprocess.Popen(
        [sys.executable, "-c", NEIGHBOUR],
        env={**base, **{"MEMGOV_CLAIM": "1GiB"}},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert neighbour.stdout is not None and neighbour.stdout.readline().startswith("ready")
    try:
        for name in args.frameworks.split(","):
            for label, extra, prefix in settings():
                env = {**base, **extra}
                done = subprocess.run(
                    [*prefix, sys.executable, "-c", TICKS + WORK[name]],
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=600,
                )
                if done.returncode != 0:
                    row = {"error": (done.stderr.strip().splitlines() or ["?"])[-1][:120]}
                else:
                    row = json.loads(done.stdout.strip().splitlines()[-1])
                memgov = [x for x in done.stderr.splitlines() if "CPU thread" in x]
                row.update(framework=name, label=label, memgov=memgov[:1])
                rows.append(row)
                print(
                    f"{name:22} {label:32} {row.get('after_import', '-'):>20} "
                    f"{row.get('after_work', '-'):>10} {row.get('busy', '-'):>5}  "
                    f"{row.get('setting', row.get('error'))}",
                    flush=True,
                )
    finally:
        neighbour.kill()
        neighbour.wait()
        shutil.rmtree(ledger, ignore_errors=True)
    print(f"load average at end: {os.getloadavg()}; {time.strftime('%Y-%m-%dT%H:%M:%SZ')}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=1)


if __name__ == "__main__":
    main()
