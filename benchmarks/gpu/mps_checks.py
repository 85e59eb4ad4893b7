"""Hard limits through MPS: checks 1-5 on a real GPU, in under 4 minutes.

    python benchmarks/gpu/mps_checks.py --out $OUT/mps_checks.json

1. hard vs soft: claim 1GiB, then allocate 4 GiB in 64 MiB steps; with torch's cap kept and
   lifted (lifting stands for any allocation outside the caching allocator's cap).
3. a claim made after CUDA initialised is soft and says why; nothing breaks.
2. 25 MNIST jobs in hard mode, one rogue (--hog-mib 4096): only the rogue fails; no job's NVML
   footprint exceeds its claim.
5. epoch time of one MNIST job: no memgov at all vs hard mode (vs MPS without memgov).
4. `memgov mps stop` and the daemon() context manager after SIGINT/SIGTERM leave no MPS daemon
   or server (and stop refuses while a client is connected, unless --force).
Every daemon uses private pipe/log folders under a temporary MEMGOV_DIR and is stopped in a
finally. NVML per-process footprints are sampled every 50 ms for the whole run.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))  # nvml.py
from nvml import FootprintSampler

ROOT = Path(__file__).resolve().parents[2]
MNIST = ROOT / "experiments" / "mnist" / "train_torch.py"
CLI = [sys.executable, "-m", "memgov.cli"]

ALLOC = r"""
import json, os, sys, time
how, size = sys.argv[1], sys.argv[2]
import memgov
c = memgov.claim(size, name="alloc-" + how)
import torch
torch.zeros(1, device="cuda"); torch.cuda.synchronize()
if how.endswith("lift"):
    torch.cuda.set_per_process_memory_fraction(1.0)  # torch's own cap off: only the driver's left
held, got, error = [], 0, None
try:
    for _ in range(64):
        held.append(torch.empty(64 << 20, dtype=torch.uint8, device="cuda")); got += 64
    torch.cuda.synchronize()
except Exception as exc:
    error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
free, total = torch.cuda.mem_get_info()
print(json.dumps({"pid": os.getpid(), "mode": c.mode, "reason": c.mode_reason,
    "reports": c.reports, "allocated_mib": got, "error": error, "mem_get_info_free_mib":
    free / 2**20, "mem_get_info_total_mib": total / 2**20, "env": {k: os.environ.get(k) for k in
    ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "CUDA_MPS_PIPE_DIRECTORY", "CUDA_VISIBLE_DEVICES")}}),
    flush=True)
time.sleep(0.5)  # the sampler reads the peak while the memory is still held
"""

LATE = r"""
import json, os
import torch
torch.zeros(1, device="cuda"); torch.cuda.synchronize()
import memgov
c = memgov.claim("2GiB", name="late")
x = torch.ones(256 << 20, dtype=torch.uint8, device="cuda")
ok = x.numel() == 256 << 20 and bool((x[:4096] == 1).all())  # x.sum() would make a 2 GiB int64
print(json.dumps({"pid": os.getpid(), "mode": c.mode, "reason": c.mode_reason,
                  "reports": c.reports, "ok": ok}), flush=True)
"""

WRAP = r"""
import json, os, runpy, sys
import memgov
c = memgov.claim(sys.argv[1], name=sys.argv[2])
print(json.dumps({"event": "memgov", "mode": c.mode, "reason": c.mode_reason,
                  "mps": c.reports.get("mps"), "pid": os.getpid()}), flush=True)
script = sys.argv[3]
sys.path.insert(0, os.path.dirname(script))
sys.argv = [script, *sys.argv[4:]]
runpy.run_path(script, run_name="__main__")
"""

CLIENT = r"""
import json, os, sys
import memgov
c = memgov.claim("1GiB", name="client")
import torch
torch.zeros(1, device="cuda"); torch.cuda.synchronize()
print(json.dumps({"pid": os.getpid(), "mode": c.mode, "reason": c.mode_reason}), flush=True)
if sys.argv[1:] == ["hold"]:
    sys.stdin.readline()
"""

CONTEXT = r"""
import json, time
from memgov._gpu import mps as _mps
with _mps.daemon() as info:
    print(json.dumps({"event": "up", "daemon_pid": info["daemon_pid"]}), flush=True)
    time.sleep(120)
"""


def base_env(memgov_dir: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("CUDA_MPS_", "MEMGOV_")) and k != "CUDA_VISIBLE_DEVICES"
    }
    env.update(MEMGOV_DIR=str(memgov_dir), PYTHONUNBUFFERED="1")
    return env


def mps_env(pipe: str) -> dict[str, str]:
    """A plain MPS client of memgov's daemon (what a process gets without memgov)."""
    log = str(Path(pipe).parent / "log")
    return {"CUDA_MPS_PIPE_DIRECTORY": pipe, "CUDA_MPS_LOG_DIRECTORY": log}


def run(cmd: list[str], env: dict[str, str], timeout: float = 120, **kw: Any) -> dict[str, Any]:
    t0 = time.time()
    rc: int | str
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, **kw)
        rc, out, err = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as exc:
        rc, out, err = "timeout", _text(exc.stdout), _text(exc.stderr)
    lines = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    return {
        "rc": rc,
        "lines": lines,
        "stdout": out[-3000:],
        "stderr_tail": err[-1500:],
        "seconds": round(time.time() - t0, 2),
    }


def _text(data: str | bytes | None) -> str:
    # TimeoutExpired carries bytes even when the run asked for text.
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")


def mps_processes() -> dict[int, str]:
    # Zombies are left out: the daemon is orphaned on purpose, and reaping it is init's job.
    return {
        p.pid: p.info["name"]
        for p in psutil.process_iter(["name", "status"])
        if str(p.info["name"] or "").startswith("nvidia-cuda-mps")
        and p.info["status"] != psutil.STATUS_ZOMBIE
    }


def cli_json(args: list[str], env: dict[str, str]) -> dict[str, Any]:
    done = subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=60)
    try:
        data = json.loads(done.stdout) if done.stdout.strip() else {}
    except ValueError:
        data = {"unparsed": done.stdout[-2000:]}
    return {"rc": done.returncode, "data": data, "stderr": done.stderr[-1000:]}


def check_alloc(env: dict[str, str], sampler: FootprintSampler) -> dict[str, Any]:
    variants = {
        "hard": {},
        "hard-lift": {},
        "soft": {"MEMGOV_MPS": "off"},
        "soft-lift": {"MEMGOV_MPS": "off"},
    }
    out: dict[str, Any] = {}
    for name, extra in variants.items():
        res = run([sys.executable, "-c", ALLOC, name, "1GiB"], {**env, **extra}, timeout=90)
        info = res["lines"][0] if res["lines"] else {}
        res.update(info, nvml_peak_mib=sampler.peak_mib(info.get("pid", -1)))
        res.pop("lines")
        out[name] = res
    out["passed"] = all(
        out[v].get("mode") == "hard"
        and "OutOfMemory" in str(out[v].get("error"))
        and (out[v]["nvml_peak_mib"] or 1e9) <= 1024
        for v in ("hard", "hard-lift")
    )
    return out


def check_late(env: dict[str, str], pipe: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, extra in {"plain-cuda": {}, "mps-client": mps_env(pipe)}.items():
        res = run([sys.executable, "-c", LATE], {**env, **extra}, timeout=90)
        res.update(res.pop("lines")[0] if res["lines"] else {})
        out[name] = res
    out["passed"] = all(
        r.get("rc") == 0
        and r.get("mode") == "soft"
        and r.get("ok")
        and "CUDA already initialised" in r.get("reason", "")
        for r in out.values()
    )
    return out


def mnist_cmd(claim: str | None, name: str, args: list[str]) -> list[str]:
    if claim is None:
        return [sys.executable, str(MNIST), *args]
    return [sys.executable, "-c", WRAP, claim, name, str(MNIST), *args]


def events(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in stdout.splitlines() if x.startswith("{")]


def check_rogue(
    env: dict[str, str], sampler: FootprintSampler, jobs: int, claim_mib: int
) -> dict[str, Any]:
    env = {**env, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "MEMGOV_THREADS": "1"}
    common = ["--epochs", "1", "--device", "gpu", "--eval-limit", "2000"]
    procs = {}
    t0 = time.time()
    for i in range(jobs):
        extra = ["--hog-mib", "4096"] if i == 0 else []
        procs[f"job{i:02d}"] = subprocess.Popen(
            mnist_cmd(f"{claim_mib}MiB", f"job{i:02d}", [*common, *extra]),
            env=env,
            cwd=MNIST.parent,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    results: dict[str, dict[str, Any]] = {}
    for name, proc in procs.items():
        try:
            stdout, stderr = proc.communicate(timeout=max(10.0, 150 - (time.time() - t0)))
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
        evs = events(stdout)
        mg = next((e for e in evs if e.get("event") == "memgov"), {})
        last = evs[-1] if evs else {}
        results[name] = {
            "rogue": name == "job00",
            "rc": proc.returncode,
            "pid": proc.pid,
            "mode": mg.get("mode"),
            "reason": mg.get("reason"),
            "last_event": last.get("event"),
            "error_kind": last.get("kind"),
            "message": str(last.get("message", ""))[-300:],
            "epoch_s": next((e["seconds"] for e in evs if e.get("event") == "epoch"), None),
            "nvml_peak_mib": sampler.peak_mib(proc.pid),
            "stderr_tail": stderr[-600:] if proc.returncode else "",
        }
    others = [r for r in results.values() if not r["rogue"]]
    rogue = results["job00"]
    return {
        "jobs": jobs,
        "claim_mib": claim_mib,
        "seconds": round(time.time() - t0, 1),
        "results": results,
        "rogue_failed_oom": rogue["rc"] != 0 and rogue["error_kind"] == "oom",
        "others_finished": sum(1 for r in others if r["rc"] == 0 and r["last_event"] == "done"),
        "all_hard": all(r["mode"] == "hard" for r in results.values()),
        "max_peak_mib": max((r["nvml_peak_mib"] or 0) for r in results.values()),
        "passed": (
            rogue["rc"] != 0
            and rogue["error_kind"] == "oom"
            and all(r["rc"] == 0 for r in others)
            and all(r["mode"] == "hard" for r in results.values())
            and all(
                r["nvml_peak_mib"] is not None and r["nvml_peak_mib"] <= claim_mib
                for r in results.values()
            )
        ),
    }


def check_epochs(env: dict[str, str], pipe: str, runs: int, deadline: float) -> dict[str, Any]:
    args = ["--epochs", "2", "--device", "gpu", "--no-eval", "--limit", "20000"]
    variants = {
        "plain": (None, {}),
        "hard": ("1GiB", {}),
        "mps-only": (None, mps_env(pipe)),
    }
    times: dict[str, list[float]] = {v: [] for v in variants}
    raw: list[dict[str, Any]] = []
    for i in range(runs):
        for name, (claim, extra) in variants.items():
            if time.time() > deadline:
                raw.append({"variant": name, "run": i, "skipped": "time budget"})
                continue
            res = run(mnist_cmd(claim, name, args), {**env, **extra}, timeout=90, cwd=MNIST.parent)
            evs = [e for e in res.pop("lines") if e.get("event") == "epoch"]
            mg = [e for e in events(res["stdout"]) if e.get("event") == "memgov"]
            epoch2 = next((e["seconds"] for e in evs if e["epoch"] == 2), None)
            raw.append(
                {
                    "variant": name,
                    "run": i,
                    "rc": res["rc"],
                    "epoch_s": [e["seconds"] for e in evs],
                    "mode": mg[0]["mode"] if mg else None,
                    "stderr_tail": res["stderr_tail"] if res["rc"] else "",
                }
            )
            if epoch2 is not None:
                times[name].append(epoch2)
    med = {k: statistics.median(v) if v else None for k, v in times.items()}
    ratio = med["hard"] / med["plain"] if med["hard"] and med["plain"] else None
    return {
        "epoch": 2,
        "runs": raw,
        "epoch2_s": times,
        "median_s": med,
        "ratio_hard_over_plain": ratio,
        "ratios_per_run": [h / p for h, p in zip(times["hard"], times["plain"], strict=False)],
    }


def holding_client(env: dict[str, str]) -> subprocess.Popen[str]:
    """A client that claims 1 GiB and starts CUDA, prints its mode, and holds until a line on
    its stdin."""
    return subprocess.Popen(
        [sys.executable, "-c", CLIENT, "hold"],
        env=env,
        text=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )


def check_stop_cli(root: Path) -> dict[str, Any]:
    env = base_env(root / "cli")
    before = mps_processes()
    out: dict[str, Any] = {"start": cli_json(["mps", "start", "--json"], env)}
    client = holding_client(env)
    assert client.stdout is not None and client.stdin is not None
    out["client"] = json.loads(client.stdout.readline() or "{}")
    out["status_with_client"] = cli_json(["mps", "status", "--json"], env)
    out["stop_refused"] = cli_json(["mps", "stop", "--json"], env)
    client.stdin.write("\n")
    client.stdin.close()
    client.wait(30)
    out["stop"] = cli_json(["mps", "stop", "--json"], env)
    time.sleep(0.5)
    out["left"] = {p: n for p, n in mps_processes().items() if p not in before}
    out["passed"] = (
        out["start"]["rc"] == 0
        and out["client"].get("mode") == "hard"
        and out["stop_refused"]["rc"] == 2
        and out["stop"]["rc"] == 0
        and not out["left"]
    )
    return out


def check_stop_signal(root: Path, sig: signal.Signals) -> dict[str, Any]:
    env = base_env(root / sig.name)
    before = mps_processes()
    ctx = subprocess.Popen(
        [sys.executable, "-c", CONTEXT],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert ctx.stdout is not None
    up = json.loads(ctx.stdout.readline() or "{}")
    client = holding_client(env)
    assert client.stdout is not None and client.stdin is not None
    connected = json.loads(client.stdout.readline() or "{}")
    during = {p: n for p, n in mps_processes().items() if p not in before}
    client.stdin.write("\n")
    client.stdin.close()
    client.wait(30)
    ctx.send_signal(sig)
    try:
        rc: int | str = ctx.wait(30)
    except subprocess.TimeoutExpired:
        ctx.kill()
        rc = "timeout"
    time.sleep(0.5)
    left = {p: n for p, n in mps_processes().items() if p not in before}
    return {
        "signal": sig.name,
        "up": up,
        "client_mode": connected.get("mode"),
        "mps_processes_during": during,
        "rc": rc,
        "left": left,
        "stderr_tail": (ctx.stderr.read() if ctx.stderr else "")[-800:],
        "passed": bool(up) and len(during) >= 2 and not left,
    }  # daemon and server were up


def machine() -> dict[str, Any]:
    import pynvml
    import torch

    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    return {
        "gpu": str(pynvml.nvmlDeviceGetName(h)),
        "driver": str(pynvml.nvmlSystemGetDriverVersion()),
        "compute_mode": pynvml.nvmlDeviceGetComputeMode(h),
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "mps_control": subprocess.run(
            ["which", "nvidia-cuda-mps-control"], capture_output=True, text=True
        ).stdout.strip(),
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--jobs", type=int, default=25)
    parser.add_argument("--claim-mib", type=int, default=1024, help="per MNIST job in check 2")
    parser.add_argument("--runs", type=int, default=3, help="epoch-time runs per variant")
    parser.add_argument("--budget", type=float, default=225, help="seconds for the whole script")
    args = parser.parse_args()
    t0 = time.time()
    root = Path(tempfile.mkdtemp(prefix="memgov-mps-check-"))
    os.environ["MEMGOV_DIR"] = str(root / "main")  # this process's own _mps calls use it too
    for name in [k for k in os.environ if k.startswith("CUDA_MPS_")]:
        del os.environ[name]
    from memgov._gpu import mps as _mps

    report: dict[str, Any] = {
        "check": "hard limits through MPS",
        "argv": sys.argv,
        "machine": machine(),
        "mps_before": mps_processes(),
        "checks": {},
    }
    checks = report["checks"]
    env = base_env(root / "main")
    sampler = FootprintSampler(period_s=0.05)
    try:
        with sampler:
            try:
                checks["daemon_start"] = _mps.start()
                pipe = checks["daemon_start"]["pipe"]
                checks["1_hard_vs_soft"] = check_alloc(env, sampler)
                checks["3_claim_after_cuda_init"] = check_late(env, pipe)
                checks["2_rogue_among_25"] = check_rogue(env, sampler, args.jobs, args.claim_mib)
                checks["5_epoch_time"] = check_epochs(env, pipe, args.runs, t0 + args.budget - 60)
            except Exception as exc:
                checks["error"] = f"{type(exc).__name__}: {exc}"
            finally:
                before_stop = mps_processes()
                checks["4a_library_stop"] = _mps.stop(force=True)
                time.sleep(0.5)
                left = {p: n for p, n in mps_processes().items() if p not in report["mps_before"]}
                checks["4a_library_stop"].update(
                    mps_before_stop=before_stop, left_after=left, passed=not left
                )
        checks["4b_cli_stop"] = check_stop_cli(root)
        for sig in (signal.SIGINT, signal.SIGTERM):
            checks[f"4c_context_{sig.name}"] = check_stop_signal(root, sig)
    finally:
        report["seconds"] = round(time.time() - t0, 1)
        report["sampler_samples"] = sampler.samples
        Path(args.out).write_text(json.dumps(report, indent=2, default=str))
    summarize(report)
    return 0


def summarize(report: dict[str, Any]) -> None:
    c = report["checks"]
    print(f"machine: {report['machine']}")
    a = c.get("1_hard_vs_soft", {})
    print(f"{'1 variant':12} {'mode':5} {'alloc MiB':>9} {'NVML peak MiB':>13}  error")
    for v in ("hard", "hard-lift", "soft", "soft-lift"):
        r = a.get(v, {})
        print(
            f"{v:12} {r.get('mode')!s:5} {r.get('allocated_mib')!s:>9} "
            f"{r.get('nvml_peak_mib')!s:>13}  {str(r.get('error'))[:70]}"
        )
    late = c.get("3_claim_after_cuda_init", {})
    print(
        "3 late claim:",
        {k: (v.get("mode"), v.get("ok")) for k, v in late.items() if isinstance(v, dict)},
        "passed",
        late.get("passed"),
    )
    r2 = c.get("2_rogue_among_25", {})
    print(
        f"2 rogue: oom={r2.get('rogue_failed_oom')} others finished={r2.get('others_finished')}"
        f"/{(r2.get('jobs') or 1) - 1} all hard={r2.get('all_hard')} max NVML peak "
        f"{r2.get('max_peak_mib')} MiB (claim {r2.get('claim_mib')}) passed={r2.get('passed')}"
    )
    r5 = c.get("5_epoch_time", {})
    print(
        f"5 epoch-2 medians s: {r5.get('median_s')} ratio hard/plain "
        f"{r5.get('ratio_hard_over_plain')} per run {r5.get('ratios_per_run')}"
    )
    for k in ("4a_library_stop", "4b_cli_stop", "4c_context_SIGINT", "4c_context_SIGTERM"):
        check = c.get(k, {})
        print(
            f"{k}: passed={check.get('passed')} left={check.get('left', check.get('left_after'))}"
        )
    if "error" in c:
        print("ERROR:", c["error"])
    print(f"total {report['seconds']} s")


if __name__ == "__main__":
    sys.exit(main())
