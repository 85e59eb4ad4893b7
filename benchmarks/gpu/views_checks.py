"""What a governed process sees of its device (docs/adapters.md, "What a governed process
sees"): the figures against the budget, soft and hard, beside 24 busy governed neighbours; a
script that sizes its batch from ``mem_get_info()``; accelerate's ``infer_auto_device_map`` for
a model larger than its 4 GiB claim. One device call (< 8 minutes on an H100):

    python benchmarks/gpu/views_checks.py --out DIR [--neighbours 24] [--dry]

``--dry``: on a machine without a GPU, simulated devices (MEMGOV_DEVICES) and the user programs'
``--dry`` modes: every step runs and its JSON is parsed, no figure means anything.
Writes DIR/views_checks.json; prints one line per check.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
G, M = 2**30, 2**20

NEIGHBOUR = r"""
import os, sys, time, memgov
claim = memgov.claim(sys.argv[1])
import torch
dry = sys.argv[2] == "dry"
device = "cpu" if dry else "cuda"
hold = torch.empty(int(sys.argv[3]), dtype=torch.uint8, device=device)
a = torch.randn(1024, 1024, device=device)
print("up", claim.mode, flush=True)
while True:  # busy: kernels all the time, as a training neighbour
    a = torch.tanh(a @ a)
    if not dry:
        torch.cuda.synchronize()
    time.sleep(0.005)
"""

PROBE = r"""
import json, os, subprocess, sys
import memgov
claim = memgov.claim(sys.argv[1])
import torch, pynvml
from memgov._gpu import nvml as _nvml
dry = sys.argv[2] == "dry"
out = {"mode": claim.mode, "budget": claim.bytes, "reports": claim.reports}
if not dry:
    x = torch.empty(1 * 2**30, dtype=torch.uint8, device="cuda")
    a = torch.randn(4096, 4096, device="cuda")
    (a @ a).sum().item()  # cuBLAS and its workspace loaded, as after a first step
    torch.cuda.synchronize()
    seen = torch.cuda.mem_get_info()
    driver = torch.cuda.mem_get_info.__wrapped__()
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByUUID(claim.device)
    v1 = pynvml.nvmlDeviceGetMemoryInfo(handle)
    v2 = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
    card = _nvml.memory(claim.device)
    own = (_nvml.processes(claim.device) or {}).get(os.getpid())
    smi = subprocess.run(["nvidia-smi", "--query-gpu=memory.total,memory.used,memory.free",
                          "--format=csv,noheader,nounits"], capture_output=True, text=True).stdout
    out.update(
        torch_seen=list(seen), torch_driver=list(driver),
        properties_total=torch.cuda.get_device_properties(0).total_memory,
        reserved=torch.cuda.memory_reserved(), nvml_own=own,
        pynvml_v1=[v1.total, v1.free, v1.used],
        pynvml_v2=[v2.total, v2.reserved, v2.free, v2.used],
        nvml_card=list(card), nvidia_smi_mib=smi.strip(),
    )
    claim.release()
    out["torch_after_release"] = list(torch.cuda.mem_get_info())
    out["pynvml_after_release"] = pynvml.nvmlDeviceGetMemoryInfo(handle).total
print(json.dumps(out), flush=True)
"""


JAX_PROBE = r"""
import json, jax, jax.numpy as jnp
(jnp.ones(1024) * 2).block_until_ready()
stats = jax.devices()[0].memory_stats() or {}
print(json.dumps({"bytes_limit": stats.get("bytes_limit"), "platform": jax.devices()[0].platform}))
"""


def env_for(memgov_dir: Path, dry: bool, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("CUDA_MPS_", "MEMGOV_")) and k != "CUDA_VISIBLE_DEVICES"
    }
    env.update(MEMGOV_DIR=str(memgov_dir), PYTHONUNBUFFERED="1", MEMGOV_QUIET="1")
    if dry:
        env["MEMGOV_DEVICES"] = "sim0:80GiB"
    env.update(extra)
    return env


def run_json(cmd: list[str], env: dict[str, str], timeout: float) -> dict[str, Any]:
    t0 = time.time()
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        rc: int | str = done.returncode
        out, err = done.stdout, done.stderr
    except subprocess.TimeoutExpired as exc:
        rc, out, err = "timeout", str(exc.stdout or ""), str(exc.stderr or "")
    lines = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    result: dict[str, Any] = lines[-1] if lines else {"stdout": out[-2000:]}
    result.update(rc=rc, seconds=round(time.time() - t0, 1))
    if rc != 0:
        result["stderr_tail"] = err[-2000:]
    return result


def start_neighbours(n: int, env: dict[str, str], dry: bool) -> list[subprocess.Popen[str]]:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", NEIGHBOUR, "2GiB", "dry" if dry else "gpu", str(int(1.0 * G))],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        for _ in range(n)
    ]
    for proc in procs:  # each says "up" once its memory is held and its kernels run
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("up"):
            raise RuntimeError(f"a neighbour did not start: {proc.stderr.read()[-1500:]}")  # type: ignore[union-attr]
    return procs


def stop(procs: list[subprocess.Popen[str]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def figures_check(probe: dict[str, Any]) -> dict[str, Any]:
    """The reported figures against the budget and against NVML's figure for the process."""
    if "torch_seen" not in probe:
        return {"passed": probe.get("rc") == 0, "note": "dry: no figures"}
    budget, own = probe["budget"], probe["nvml_own"]
    free, total = probe["torch_seen"]
    truth = budget - own if own is not None else None
    return {
        "total_minus_budget": total - budget,
        "free_minus_budget_less_nvml_own": None if truth is None else free - truth,
        "free_error_pct_of_budget": None
        if truth is None
        else round(100 * abs(free - truth) / budget, 2),
        "pynvml_total_is_budget": probe["pynvml_v1"][0] == budget == probe["pynvml_v2"][0],
        "released_shows_card": probe["torch_after_release"][1] == probe["properties_total"],
        "passed": total == budget and truth is not None and abs(free - truth) <= budget / 100,
    }


def phase(name: str, args: argparse.Namespace, env: dict[str, str], report: dict[str, Any]) -> None:
    dry = args.dry
    flag = ["--dry"] if dry else []
    neighbours = start_neighbours(args.neighbours, env, dry)
    try:
        probe = run_json([sys.executable, "-c", PROBE, "4GiB", "dry" if dry else "gpu"], env, 120)
        report[f"{name}_figures"] = {"probe": probe, **figures_check(probe)}
        for views in ("on", "off"):
            batch = run_json(
                [sys.executable, str(HERE / "views_batch.py"), *flag],
                {**env, "MEMGOV_CLAIM": "4GiB", "MEMGOV_VIEWS": views},
                120,
            )
            report[f"{name}_batch_views_{views}"] = batch
    finally:
        stop(neighbours)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--neighbours", type=int, default=24)
    parser.add_argument("--dry", action="store_true")
    parser.add_argument("--no-hard", action="store_true", help="skip the MPS (hard) phase")
    args = parser.parse_args()
    if args.neighbours < 0:
        parser.error(f"--neighbours {args.neighbours}: accepted a whole number >= 0")
    t0 = time.time()
    root = Path(tempfile.mkdtemp(prefix="memgov-views-"))
    os.environ["MEMGOV_DIR"] = str(root / "ledger")
    report: dict[str, Any] = {"check": "views", "argv": sys.argv}
    flag = ["--dry"] if args.dry else []
    soft = env_for(root / "ledger", args.dry, MEMGOV_MPS="off")
    try:
        # accelerate alone on the GPU first: its model is built on the CPU (5 GB).
        acc = [sys.executable, str(HERE / "views_accelerate.py"), *flag]
        report["accelerate_ungoverned"] = run_json(acc, {**soft, "MEMGOV_CLAIM": "off"}, 120)
        report["accelerate_views_off"] = run_json(
            acc, {**soft, "MEMGOV_CLAIM": "4GiB", "MEMGOV_VIEWS": "off"}, 120
        )
        report["accelerate_governed"] = run_json(
            [*acc, "--run"], {**soft, "MEMGOV_CLAIM": "4GiB"}, 240
        )
        if not args.dry:  # JAX's own figure under a 4 GiB claim (no wrapper: the adapter's pool)
            report["jax_bytes_limit"] = run_json(
                [sys.executable, "-c", JAX_PROBE], {**soft, "MEMGOV_CLAIM": "4GiB"}, 120
            )
        phase("soft", args, soft, report)
        if not args.dry and not args.no_hard:
            from memgov._gpu import mps as _mps

            report["mps_start"] = _mps.start()
            try:
                phase("hard", args, env_for(root / "ledger", False), report)
            finally:
                report["mps_stop"] = _mps.stop(force=True)
    except Exception as exc:
        report["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        report["seconds"] = round(time.time() - t0, 1)
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "views_checks.json").write_text(json.dumps(report, indent=2, default=str))
    for key, value in report.items():
        if isinstance(value, dict):
            brief = {k: v for k, v in value.items() if k not in ("probe", "stderr_tail", "reports")}
            print(f"{key}: {json.dumps(brief, default=str)[:600]}")
        else:
            print(f"{key}: {value}")
    return 0 if "error" not in report else 1


if __name__ == "__main__":
    sys.exit(main())
