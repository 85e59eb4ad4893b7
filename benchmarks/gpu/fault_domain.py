"""What one job's fatal CUDA fault costs its neighbours: under memgov's MPS daemons and without MPS.

    python3 benchmarks/gpu/fault_domain.py [--conditions same,other,nomps] [--fault assert]
        [--n 24] [--run-s 20] [--out DIR]

N governed neighbours (MEMGOV_CLAIM, a small matmul training loop that synchronises every 20
steps) start; once all of them are training, one governed job triggers a fatal fault: ``assert``
(an out-of-bounds index on the device: a device-side assert) or ``illegal`` (a Triton kernel
storing to a wild address: an illegal memory access). Conditions: ``same`` (one memgov MPS
daemon, faulting job on it beside the neighbours), ``other`` (two daemons, MEMGOV_MPS_CLIENTS=N
with the default fill policy: the neighbours fill daemon 0, the faulting job lands on daemon 1),
``nomps`` (no daemon: soft claims, one context each). Each neighbour trains RUN_S seconds after
it is ready; a neighbour still running RUN_S + 60 s after the fault is counted hung and killed.
After the fault, fresh probe clients (one tiny CUDA op each) are started every second for 40 s:
the first one that succeeds is the time until the faulted daemon accepts clients again. Per
neighbour: exit code, steps, the first line of its error, whether it hung, its MPS pipe. Raw JSON
to OUT/fault_domain.json with each daemon's log tails; a summary on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

JOB = r"""
import json, os, sys, time
role, ready, out, run_s, fault = sys.argv[1:6]
run_s = float(run_s)
res = {"role": role, "pipe": os.environ.get("CUDA_MPS_PIPE_DIRECTORY"), "steps": 0, "error": None}
t0 = time.time()
try:
    import torch
    x = torch.randn(256, 1024, device="cuda")
    res["pipe"] = os.environ.get("CUDA_MPS_PIPE_DIRECTORY")  # set by memgov as CUDA starts
    w = torch.randn(1024, 1024, device="cuda", requires_grad=True)
    opt = torch.optim.SGD([w], lr=1e-6)
    for i in range(40):
        loss = (x @ w).square().mean(); opt.zero_grad(); loss.backward(); opt.step()
    torch.cuda.synchronize()
    open(ready, "w").close()
    res["ready_s"] = time.time() - t0
    if role == "fault":
        res["fault_at"] = time.time()
        if fault == "assert":
            idx = torch.tensor([1 << 20], device="cuda")
            x[idx] = 1.0
        else:
            import triton, triton.language as tl
            @triton.jit
            def wild(p):
                tl.store(p + (1 << 40), 1.0)
            wild[(1,)](x)
        torch.cuda.synchronize()
        res["error"] = "no fault raised"
    else:
        end = time.time() + run_s
        while time.time() < end:
            for _ in range(20):
                loss = (x @ w).square().mean(); opt.zero_grad(); loss.backward(); opt.step()
                res["steps"] += 1
            torch.cuda.synchronize()
        res["finished"] = True
except BaseException as exc:
    res["error"] = (f"{type(exc).__name__}: {exc}".strip().splitlines() or [""])[0][:300]
res["wall_s"] = time.time() - t0
res["end_at"] = time.time()
with open(out, "w") as f:
    json.dump(res, f)
"""

PROBE = "import torch; torch.ones(1, device='cuda').sum().item(); print('ok')"


def memgov(args: list[str], env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "memgov", *args], env=env, capture_output=True, text=True, timeout=60
    )
    return (done.stdout + done.stderr).strip()


def log_tails(ledger: Path) -> dict[str, str]:
    tails = {}
    mps = ledger / "mps"
    for log in sorted(mps.glob("log*/*.log")) if mps.exists() else []:
        text = log.read_text(errors="replace").splitlines()
        tails[str(log.relative_to(ledger))] = "\n".join(text[-15:])
    return tails


def probe_loop(env: dict[str, str], fault_at: float, out: dict[str, Any]) -> None:
    tries = []
    while time.time() - fault_at < 40:
        t = time.time()
        try:
            done = subprocess.run(
                [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=15
            )
            ok = done.returncode == 0 and "ok" in done.stdout
            why = (done.stderr.strip().splitlines() or [""])[-1][:200]
        except subprocess.TimeoutExpired:
            ok, why = False, "probe hung 15 s"
        tries.append({"at_s": round(t - fault_at, 2), "ok": ok, "why": "" if ok else why})
        if ok:
            out["accepts_after_s"] = round(time.time() - fault_at, 2)
            break
        time.sleep(max(0.0, 1.0 - (time.time() - t)))
    out["probes"] = tries


def condition(name: str, n: int, fault: str, run_s: float, work: Path) -> dict[str, Any]:
    ledger = work / f"ledger-{name}"
    shutil.rmtree(ledger, ignore_errors=True)
    ledger.mkdir(parents=True)
    # 2 GiB each: a context and cuBLAS's workspace alone take about 0.6 GiB on an H100 (768 MiB
    # failed: cublasCreate under the cap)
    env = dict(os.environ, MEMGOV_DIR=str(ledger), MEMGOV_CLAIM="2GiB", OMP_NUM_THREADS="1")
    env.pop("CUDA_MPS_PIPE_DIRECTORY", None)
    result: dict[str, Any] = {"condition": name, "fault": fault, "n": n}
    if name in ("same", "other"):
        if name == "other":
            env["MEMGOV_MPS_CLIENTS"] = str(n)
        result["mps_start"] = memgov(
            ["mps", "start", "--daemons", "1" if name == "same" else "2"], env
        )
    files = work / f"files-{name}"
    shutil.rmtree(files, ignore_errors=True)
    files.mkdir()
    procs = []
    for i in range(n):
        argv = [
            sys.executable,
            "-c",
            JOB,
            "neighbour",
            f"{files}/r{i}",
            f"{files}/o{i}.json",
            str(run_s),
            fault,
        ]
        procs.append(subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True))
    deadline = time.time() + 120
    while time.time() < deadline and sum((files / f"r{i}").exists() for i in range(n)) < n:
        if all(p.poll() is not None for p in procs):
            break
        time.sleep(0.2)
    result["ready"] = sum((files / f"r{i}").exists() for i in range(n))
    faulter = subprocess.Popen(
        [sys.executable, "-c", JOB, "fault", f"{files}/rf", f"{files}/of.json", str(run_s), fault],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        faulter.wait(timeout=90)
    except subprocess.TimeoutExpired:
        faulter.kill()
    fault_at = time.time()
    recovery: dict[str, Any] = {}
    prober = threading.Thread(
        target=probe_loop, args=(dict(env, MEMGOV_CLAIM="1GiB"), fault_at, recovery)
    )
    prober.start()
    jobs = []
    for i, p in enumerate(procs):
        hung = False
        try:
            p.wait(timeout=max(1.0, fault_at + run_s + 60 - time.time()))
        except subprocess.TimeoutExpired:
            hung = True
            p.kill()
            p.wait()
        stderr = p.stderr.read() if p.stderr else ""
        job = {"rc": p.returncode, "hung": hung, "stderr_tail": stderr.strip().splitlines()[-3:]}
        path = files / f"o{i}.json"
        if path.exists():
            job.update(json.loads(path.read_text()))
        jobs.append(job)
    prober.join()
    fstderr = faulter.stderr.read() if faulter.stderr else ""
    fjob = {"rc": faulter.returncode, "stderr_tail": fstderr.strip().splitlines()[-3:]}
    if (files / "of.json").exists():
        fjob.update(json.loads((files / "of.json").read_text()))
    result.update(neighbours=jobs, faulter=fjob, recovery=recovery, logs=log_tails(ledger))
    if name in ("same", "other"):
        result["mps_status_after"] = memgov(["mps", "status"], env)
        result["mps_stop"] = memgov(["mps", "stop"], env)
    return result


def summary(r: dict[str, Any]) -> str:
    jobs = r["neighbours"]
    fin = sum(bool(j.get("finished")) for j in jobs)
    hung = sum(j["hung"] for j in jobs)
    errs = sorted({(j.get("error") or "")[:90] for j in jobs if j.get("error")})
    pipes = sorted({str(j.get("pipe")) for j in jobs})
    return (
        f"{r['condition']:6} fault={r['fault']:7} ready {r['ready']}/{r['n']}  finished {fin}  "
        f"hung {hung}  failed {len(jobs) - fin - hung}  faulter rc={r['faulter']['rc']} "
        f"({(r['faulter'].get('error') or '')[:80]}) pipe={r['faulter'].get('pipe')}  "
        f"neighbours' pipes {pipes}  accepts again after {r['recovery'].get('accepts_after_s')} s\n"
        + "".join(f"    neighbour error: {e}\n" for e in errs)
    )


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--conditions", default="same,other,nomps")
    ap.add_argument("--fault", default="assert", help="assert or illegal, or both: assert,illegal")
    ap.add_argument("--n", type=int, default=24)
    ap.add_argument("--run-s", type=float, default=20.0)
    ap.add_argument("--out", type=Path, default=Path("out"))
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="fault-domain-"))
    results = []
    for fault in a.fault.split(","):
        for name in a.conditions.split(","):
            r = condition(name, a.n, fault, a.run_s, work)
            results.append(r)
            print(summary(r), flush=True)
            (a.out / "fault_domain.json").write_text(json.dumps(results, indent=1))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
