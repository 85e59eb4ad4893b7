"""The torch adapter's background CUDA context on a real GPU: what it saves and what it changes.

A governed process makes its claimed GPU's context in a thread from ``import torch`` on, while
the script sets itself up (MEMGOV_TORCH_WARM, on by default). Under a `memgov mps start` daemon
(private MEMGOV_DIR), with MEMGOV_TORCH_WARM on and off:

  setup      N processes at once (1 and 25): ``import torch``, SETUP seconds of the script's own
             set-up (``import torchvision``, then a sleep), then the first CUDA tensor; each
             reports when its first tensor was done from launch and how long that call took,
             and whether NVML listed it during the set-up (its context already made)
  cap        the allocator cap still lands at the first CUDA call (the adapter's report), and a
             tensor past the claim fails with memgov's message while the process goes on
  fork       a child forked after the claim, before any CUDA call: on, its first CUDA call
             raises torch's "Cannot re-initialize CUDA in forked subprocess" (as after any CUDA
             use in the parent); off, it may use CUDA as without memgov. The parent trains after.
  loader     DataLoader workers (fork) iterated before the script's first CUDA call, then a
             step on the GPU: finishes, nothing on stderr but memgov's info lines
  exit       ``import torch`` and exit at once (``--help``'s shape): exit 0, nothing left behind

    python3 benchmarks/gpu/torch_warm.py --out $OUT/torch_warm.json
Exits 1 when a check fails; the JSON holds every process's figures and stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

SETUP = r"""
import json, os, sys, time
launch = float(os.environ["WARM_LAUNCH"])
import torch
imported = time.time()
import torchvision  # the script's own set-up: what the context is made beside
time.sleep(float(os.environ["WARM_SETUP_S"]))
import pynvml
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
listed = any(p.pid == os.getpid() for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h))
t = time.time()
x = torch.zeros(1, device="cuda"); torch.cuda.synchronize()
done = time.time()
print(json.dumps({"torch_s": imported - launch, "first_tensor_done_s": done - launch,
                  "first_call_s": done - t, "listed_before_first_call": listed}))
"""

CAP = r"""
import json, memgov, torch
torch.zeros(1, device="cuda")
out = {"initialised": torch.cuda.is_initialized()}
try:
    torch.empty(3 * 2**30, dtype=torch.uint8, device="cuda")
    out["past_claim"] = "allocated"
except torch.OutOfMemoryError as exc:
    out["past_claim"] = "refused"
    out["message_names_budget"] = "memgov: this process's budget" in str(exc)
y = torch.ones(1024, device="cuda").sum().item()
out["went_on"] = y == 1024
print(json.dumps(out))
"""

FORK = r"""
import json, os, torch
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(r)
    try:
        torch.zeros(1, device="cuda"); torch.cuda.synchronize()
        said = "ok"
    except Exception as exc:
        said = f"{type(exc).__name__}: {exc}"
    os.write(w, said.encode()[:400]); os._exit(0)
os.close(w)
child = os.read(r, 1000).decode()
os.waitpid(pid, 0)
x = torch.ones(256, device="cuda"); loss = (x * 2).sum().item()
print(json.dumps({"child": child, "parent_trained": loss == 512}))
"""

LOADER = r"""
import json, torch
from torch.utils.data import DataLoader, TensorDataset
data = TensorDataset(torch.rand(512, 8), torch.rand(512, 1))
loader = DataLoader(data, batch_size=64, num_workers=2,
                    multiprocessing_context="fork", persistent_workers=True)
batches = [b for b in loader]  # workers forked before the script's first CUDA call
model = torch.nn.Linear(8, 1).cuda(); opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    for x, y in loader:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x.cuda()), y.cuda()).backward(); opt.step()
torch.cuda.synchronize()
print(json.dumps({"batches": len(batches), "trained": True}))
"""

EXIT = "import torch"


def spawn(code: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", code],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str], limit: float = 240) -> dict[str, Any]:
    out, err = proc.communicate(timeout=limit)
    lines = [line for line in err.splitlines() if line.strip()]
    foreign = [line for line in lines if not line.startswith("memgov: ")]
    result: dict[str, Any] = {
        "rc": proc.returncode,
        "stderr_foreign": foreign[-20:],
        "memgov_lines": [ln for ln in lines if ln.startswith("memgov: ")],
    }
    try:
        result.update(json.loads(out.strip().splitlines()[-1]))
    except (IndexError, ValueError):
        result["stdout"] = out[-2000:]
    return result


def run_setup(env: dict[str, str], n: int, setup_s: float) -> dict[str, Any]:
    launch = time.time()
    procs = [
        spawn(SETUP, {**env, "WARM_LAUNCH": str(launch), "WARM_SETUP_S": str(setup_s)})
        for _ in range(n)
    ]
    jobs = [finish(p) for p in procs]
    ok = [j for j in jobs if j["rc"] == 0 and "first_call_s" in j]
    summary: dict[str, Any] = {"n": n, "ok": len(ok), "span_s": round(time.time() - launch, 2)}
    for key in ("torch_s", "first_tensor_done_s", "first_call_s"):
        values = [float(j[key]) for j in ok]
        if values:
            summary[f"{key}_median"] = round(statistics.median(values), 3)
            summary[f"{key}_max"] = round(max(values), 3)
    summary["listed_before_first_call"] = sum(bool(j["listed_before_first_call"]) for j in ok)
    summary["jobs"] = jobs
    return summary


def mps(base: dict[str, str], action: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "memgov", "mps", action],
        cwd=ROOT,
        env=base,
        capture_output=True,
        text=True,
        timeout=60,
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, nargs="+", default=[1, 25])
    p.add_argument("--setup", type=float, default=2.0, help="seconds of set-up after imports")
    p.add_argument("--claim", default="1GiB")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    if any(n < 1 for n in args.n) or args.setup < 0:
        p.error("--n takes whole numbers >= 1 and --setup seconds >= 0")
    report: dict[str, Any] = {"claim": args.claim, "setup_s": args.setup}
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="memgov-warm-") as ledger:
        base = {**os.environ, "MEMGOV_DIR": ledger, "MEMGOV_CLAIM": args.claim}
        base.pop("MEMGOV_TORCH_WARM", None)
        started = mps(base, "start")
        report["mps_start"] = {"rc": started.returncode, "err": started.stderr[-1000:]}
        try:
            for warm in ("on", "off"):
                env = {**base, "MEMGOV_TORCH_WARM": warm}
                part: dict[str, Any] = {}
                for n in args.n:
                    part[f"setup_{n}"] = run_setup(env, n, args.setup)
                for name, code in (
                    ("cap", CAP),
                    ("fork", FORK),
                    ("loader", LOADER),
                    ("exit", EXIT),
                ):
                    t = time.time()
                    part[name] = {**finish(spawn(code, env)), "wall_s": round(time.time() - t, 2)}
                report[warm] = part
                failures += check(warm, part, args.n)
        finally:
            report["mps_stop"] = mps(base, "stop").returncode
    report["failures"] = failures
    Path(args.out).write_text(json.dumps(report, indent=1))
    for warm in ("on", "off"):
        part = report[warm]
        for n in args.n:
            s = {k: v for k, v in part[f"setup_{n}"].items() if k != "jobs"}
            print(f"MEMGOV_TORCH_WARM={warm} setup n={n}: {json.dumps(s)}")
        for name in ("cap", "fork", "loader", "exit"):
            print(f"MEMGOV_TORCH_WARM={warm} {name}: {json.dumps(part[name])}")
    print("failures:", failures or "none")
    return 1 if failures else 0


def check(warm: str, part: dict[str, Any], ns: list[int]) -> list[str]:
    bad: list[str] = []

    def need(ok: bool, what: str) -> None:
        if not ok:
            bad.append(f"MEMGOV_TORCH_WARM={warm}: {what}")

    for n in ns:
        s = part[f"setup_{n}"]
        need(s["ok"] == n, f"setup n={n}: {s['ok']}/{n} finished")
        if warm == "on":
            need(
                s["listed_before_first_call"] == s["ok"],
                f"setup n={n}: not every context made before the first call",
            )
    cap, fork, loader, end = (part[k] for k in ("cap", "fork", "loader", "exit"))
    for name, r in (("cap", cap), ("fork", fork), ("loader", loader), ("exit", end)):
        need(
            r["rc"] == 0 and not r["stderr_foreign"],
            f"{name}: exit {r['rc']}, stderr {r['stderr_foreign']}",
        )
    need(
        cap.get("past_claim") == "refused"
        and cap.get("message_names_budget") is True
        and cap.get("went_on") is True,
        f"cap: {cap}",
    )
    child = str(fork.get("child"))
    if warm == "on":
        need("Cannot re-initialize CUDA in forked subprocess" in child, f"fork: child {child!r}")
    else:
        need(child == "ok", f"fork: child {child!r}")
    need(fork.get("parent_trained") is True, "fork: the parent did not train")
    need(loader.get("trained") is True, f"loader: {loader}")
    return bad


if __name__ == "__main__":
    sys.exit(main())
