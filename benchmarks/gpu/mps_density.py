"""Density past the MPS client cap on one GPU, in one device call (< 9 minutes).

    python benchmarks/gpu/mps_density.py --out $OUT [--budget 500] [--only STEP,...] [--dry-run]

Steps (by default env, servers, mps48, mps96, mps140, nomps48, nomps96: the table of
docs/hard-limits.md; a step that would not fit in what is left of --budget is skipped and listed
as such; ONLY/--only runs the named ones). Every pack step runs with --pack-args (default
"--runner preload", PACK_ARGS; "" for spawned jobs):

  env       GPU, driver, cores, host memory, control program
  servers   `memgov mps start --daemons 3`: start-up time of each control daemon; per daemon the
            first client's CUDA start (its server starts then) and a second's; each server's GPU
            and host memory
  mps48     memgov pack --n 48  under MPS (1 daemon)     } the throughput table; every pack run
  mps96     memgov pack --n 96  under MPS (2 daemons)    } is the same job (torch MNIST CNN,
  mps140    memgov pack --n 140 under MPS (3 daemons),   } batch 32, 2 epochs of 6,400 images
            one of them a rogue (--rogue 1:4096)          } after a start barrier), claims
  mps140auto  the same with pack's automatic claim (made smaller so that 140 fit)
  mps48x2   48 jobs spread over 2 daemons (MEMGOV_MPS_POLICY=spread): do servers time-slice
            against each other? (same jobs as mps48, one server more)
  nomps140  140 jobs without MPS, MEMGOV_CONTEXTS=off: how many contexts start, and the rest
            reported with reason `contexts`
  nomps48   48 jobs without MPS (time-slicing)
  nomps96   96 jobs without MPS at pack's default context limit (72): the rest wait, reason
            `contexts`
  wall      bare CUDA contexts (ctypes, no framework), 200 at once, until the GPU refuses: by
            default, with CUDA_DEVICE_MAX_CONNECTIONS=1, and holding no memory (if time is
            left); NVML and BAR1 memory at the wall
  hostmem   one torch process's host USS at each stage (import, CUDA, cuDNN, training), with
            CUDA_MODULE_LOADING=LAZY and EAGER, and as an MPS client
  nomps140q 140 jobs without MPS at pack's default context limit (72): queued, not failed

A watchdog samples MemAvailable every 0.5 s through every step and stops the step when it falls
below 10 GiB (a run on this machine with 150 clients at once lost the machine): SIGTERM to the
pack, which stops its jobs (SIGKILL after 10 s) and writes its report; a wave of bare clients
stops starting more and releases them. pack's own host-memory gate (docs/pack.md) sizes each job
from the USS the earlier runs recorded, so 96 and 140 jobs start at once only if the host holds
them. Raw JSON: $OUT/mps_density.json (every pack report in
full, every sample series); a short table is printed last.

--dry-run: the same steps on a machine without a GPU (CPU packs of 3-4 tiny jobs; a stand-in
control program from tests/helpers for `servers`): checks the script, not the GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))
from nvml import Background, process_usage

ROOT = Path(__file__).resolve().parents[2]
MNIST = ROOT / "experiments" / "mnist"
GIB = 2**30
MIB = 2**20
LOW_MEMORY = 10 * GIB
STEPS = (
    "env",
    "servers",
    "mps48",
    "mps96",
    "mps140",
    "mps140auto",
    "nomps48",
    "nomps96",
    "nomps140q",
    "mps48x2",
    "nomps140",
    "wall",
    "hostmem",
)
DEFAULT_STEPS = ("env", "servers", "mps48", "mps96", "mps140", "nomps48", "nomps96")
"""The table of docs/hard-limits.md in one call (~330 s on the H200); the rest with --only."""
# What each step needs at most (s); a step starts only when this much of the budget is left.
NEEDS = {
    "env": 15,
    "servers": 10,
    "mps48": 70,
    "mps96": 100,
    "mps140": 170,
    "mps140auto": 170,
    "mps48x2": 70,
    "nomps140": 125,
    "wall": 110,
    "hostmem": 50,
    "nomps48": 70,
    "nomps96": 110,
    "nomps140q": 130,
}
# Starting 96-140 torch processes on 16 cores takes 35-65 s before the last one trains (measured
# on the H200): a call that runs one big step gives it more, e.g. MPS_DENSITY_NEEDS="mps140=300".
for _item in os.environ.get("MPS_DENSITY_NEEDS", "").replace(",", " ").split():
    _step, _, _seconds = _item.partition("=")
    if _step not in NEEDS or not _seconds.isdigit():
        raise SystemExit(f"MPS_DENSITY_NEEDS: {_item!r}; accepted STEP=SECONDS ({list(NEEDS)})")
    NEEDS[_step] = int(_seconds)
EPOCHS, LIMIT = 2, 6400
"""The one job of every pack run: 2 epochs of 6,400 images (200 steps of batch 32) after a
barrier (--barrier): every job starts training once all have started up (or after 40 s), so the
second epoch is measured with all jobs at once, not their start-up stagger."""

CLIENT = r"""
import ctypes, os, sys, time
t0 = time.monotonic()
def say(*a):
    print(*a, flush=True)
try:
    cuda = ctypes.CDLL("libcuda.so.1")
except OSError as e:
    say("err", "dlopen", 0, "no-libcuda", 0.0); sys.exit(0)
def name(rc):
    s = ctypes.c_char_p(); cuda.cuGetErrorName(rc, ctypes.byref(s))
    return (s.value or b"?").decode()
def check(rc, what):
    if rc != 0:
        say("err", what, rc, name(rc), round(time.monotonic() - t0, 3)); sys.exit(0)
check(cuda.cuInit(0), "cuInit")
dev, ctx = ctypes.c_int(), ctypes.c_void_p()
check(cuda.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "context")
check(cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
hold = int(os.environ.get("HOLD_MIB", "256"))
ptr = ctypes.c_uint64()
if hold:
    check(cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(hold << 20)), "cuMemAlloc")
say("ok", os.getpid(), round(time.monotonic() - t0, 3))
sys.stdin.read()
"""
"""A bare CUDA client: the driver API only (no framework), a context, HOLD_MIB held, then it
waits for its stdin to close. One line on stdout: ok PID SECONDS or err WHAT CODE NAME SECONDS."""

HOSTMEM = r"""
import json, os, sys, time
import psutil
me = psutil.Process()
def uss():
    return round(me.memory_full_info().uss / 2**20, 1)
stages = {"python": uss()}
import numpy
import torch
stages["import_torch"] = uss()
torch.zeros(1, device="cuda"); torch.cuda.synchronize()
stages["cuda_init"] = uss()
from torch import nn
model = nn.Sequential(nn.Conv2d(1, 32, 3), nn.ReLU(), nn.Conv2d(32, 64, 3), nn.ReLU(),
                      nn.MaxPool2d(2), nn.Flatten(), nn.Linear(64 * 12 * 12, 128), nn.ReLU(),
                      nn.Linear(128, 10)).cuda()
opt = torch.optim.Adadelta(model.parameters())
x = torch.rand(32, 1, 28, 28).pin_memory(); y = torch.randint(0, 10, (32,))
loss = nn.functional.cross_entropy(model(x.cuda(non_blocking=True)), y.cuda()); loss.backward()
torch.cuda.synchronize()
stages["first_step_cudnn"] = uss()
for _ in range(200):
    opt.zero_grad()
    nn.functional.cross_entropy(model(x.cuda(non_blocking=True)), y.cuda()).backward()
    opt.step()
torch.cuda.synchronize()
stages["after_200_steps"] = uss()
info = me.memory_full_info()
print(json.dumps({"uss_mib": stages, "rss_mib": round(info.rss / 2**20, 1),
                  "module_loading": os.environ.get("CUDA_MODULE_LOADING"),
                  "threads": me.num_threads()}), flush=True)
"""


# -- watching the machine ------------------------------------------------------------------------
class Watch(Background):
    """MemAvailable, GPU memory (NVML), BAR1 and MPS server processes, every 0.5 s, for one step.

    When MemAvailable falls below LOW_MEMORY it calls ``on_low`` once (the step is stopped)."""

    def __init__(self, nvml: Any | None, on_low: Any = None) -> None:
        self.nvml = nvml
        self.on_low = on_low
        self.series: list[dict[str, Any]] = []
        self.low = False
        self.min_available = None
        self.peak_gpu_used = None
        self.peak_bar1_used = None
        self.peak_procs = 0
        self.servers: dict[int, dict[str, Any]] = {}
        super().__init__()

    def _run(self) -> None:
        t0 = time.monotonic()
        last_kept = -10.0
        while not self._stop.is_set():
            now = time.monotonic() - t0
            point = self._sample()
            point["t"] = round(now, 2)
            if now - last_kept >= 2.0:  # the raw series every 2 s; extremes every 0.5 s
                self.series.append(point)
                last_kept = now
            if point["available_mib"] < LOW_MEMORY / MIB and not self.low:
                self.low = True
                self.series.append({**point, "event": "MemAvailable below 10 GiB: step stopped"})
                if self.on_low is not None:
                    self.on_low()
            self._stop.wait(0.5)

    def _sample(self) -> dict[str, Any]:
        available = psutil.virtual_memory().available / MIB
        self.min_available = (
            available if self.min_available is None else min(self.min_available, available)
        )
        point: dict[str, Any] = {"available_mib": round(available)}
        servers = []
        for proc in psutil.process_iter(["name", "pid"]):
            if str(proc.info["name"] or "").startswith("nvidia-cuda-mps"):
                try:
                    mem = proc.memory_full_info()
                    servers.append((proc.pid, proc.info["name"], mem.rss, mem.uss))
                except psutil.Error:
                    continue
        gpu_by_pid: dict[int, int] = {}
        if self.nvml is not None:
            nv = self.nvml
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(0)
                used = nv.nvmlDeviceGetMemoryInfo(handle).used / MIB
                point["gpu_used_mib"] = round(used)
                self.peak_gpu_used = max(self.peak_gpu_used or 0, used)
                with_bar1 = nv.nvmlDeviceGetBAR1MemoryInfo(handle)
                point["bar1_used_mib"] = round(with_bar1.bar1Used / MIB)
                self.peak_bar1_used = max(self.peak_bar1_used or 0, with_bar1.bar1Used / MIB)
                gpu_by_pid = process_usage(handle)
                point["gpu_procs"] = len(gpu_by_pid)
                self.peak_procs = max(self.peak_procs, len(gpu_by_pid))
            except Exception as exc:  # a sampler must not end the step
                point["nvml_error"] = str(exc)[:200]
        for pid, name, rss, uss in servers:
            seen = self.servers.setdefault(
                pid, {"name": name, "rss_mib": 0, "uss_mib": 0, "gpu_mib": None}
            )
            seen["rss_mib"] = max(seen["rss_mib"], round(rss / MIB, 1))
            seen["uss_mib"] = max(seen["uss_mib"], round(uss / MIB, 1))
            if pid in gpu_by_pid:
                seen["gpu_mib"] = max(seen["gpu_mib"] or 0, round(gpu_by_pid[pid] / MIB, 1))
        point["mps_procs"] = len(servers)
        return point

    def summary(self) -> dict[str, Any]:
        return {
            "min_available_mib": _r(self.min_available),
            "peak_gpu_used_mib": _r(self.peak_gpu_used),
            "peak_bar1_used_mib": _r(self.peak_bar1_used),
            "peak_gpu_procs": self.peak_procs,
            "stopped_for_memory": self.low,
            "mps_processes": self.servers,
            "series": self.series,
        }


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _nvml() -> Any | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:
        return None


# -- running things ------------------------------------------------------------------------------
class Bench:
    def __init__(self, out: Path, budget: float, dry: bool, work: Path) -> None:
        self.out = out
        self.budget = budget
        self.dry = dry
        self.work = work
        self.pack_args: list[str] = []
        self.t0 = time.monotonic()
        self.nvml = None if dry else _nvml()
        self.results: dict[str, Any] = {
            "budget_s": budget,
            "dry_run": dry,
            "steps": {},
            "skipped": {},
        }
        self.env = dict(os.environ)
        self.env.update(
            MEMGOV_DIR=str(work / "ledger"),
            PYTHONUNBUFFERED="1",
            MEMGOV_DATA_CACHE=str(work / "data-cache"),
        )
        if dry:
            fake = work / "bin"
            fake.mkdir(exist_ok=True)
            program = fake / "nvidia-cuda-mps-control"
            helper = ROOT / "tests" / "helpers" / "fake_mps_control.py"
            program.write_text(
                f"#!{sys.executable}\nimport runpy\nrunpy.run_path("
                f"{str(helper)!r}, run_name='__main__')\n"
            )
            program.chmod(0o755)
            self.env["PATH"] = f"{fake}{os.pathsep}{self.env['PATH']}"

    def left(self) -> float:
        return self.budget - (time.monotonic() - self.t0)

    def step(self, name: str, fn: Any) -> None:
        need = NEEDS[name] + 15 if not self.dry else 5  # + what stopping a pack may take
        if self.left() < need:
            self.results["skipped"][name] = f"{self.left():.0f} s of the budget left, needs {need}"
            print(f"=== {name}: skipped ({self.results['skipped'][name]})", flush=True)
            return
        print(f"=== {name} ({self.left():.0f} s of the budget left)", flush=True)
        t0 = time.monotonic()
        try:
            result = fn()
        except Exception as exc:  # one step's failure must not lose the others' results
            result = {"error": f"{type(exc).__name__}: {exc}"}
        result["step_s"] = round(time.monotonic() - t0, 1)
        self.results["steps"][name] = result
        self.save()
        print(f"--- {name}: {result['step_s']} s", flush=True)

    def save(self) -> None:
        path = self.out / "mps_density.json"
        path.write_text(json.dumps(self.results, indent=1, default=str))

    def cli(
        self, *args: str, timeout: float = 60, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "memgov", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env or self.env,
            cwd=ROOT,
        )

    def run_guarded(self, argv: list[str], limit: float, env: dict[str, str]) -> dict[str, Any]:
        """Run ``argv`` in its own session under the watchdog; stop it at ``limit`` seconds."""
        limit = max(5.0, min(limit, self.left() - 5))
        log = self.work / f"log-{time.monotonic_ns()}.txt"
        with open(log, "w") as f:
            proc = subprocess.Popen(
                argv, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True
            )

        def stop() -> None:
            with _quiet():
                os.killpg(proc.pid, signal.SIGTERM)

        t0 = time.monotonic()
        with Watch(self.nvml, stop) as watch:
            try:
                proc.wait(limit)
            except subprocess.TimeoutExpired:
                stop()
                try:
                    proc.wait(20)  # pack stops its jobs (10 s grace) and writes its report
                except subprocess.TimeoutExpired:
                    with _quiet():
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        text = log.read_text(errors="replace")
        return {
            "rc": proc.returncode,
            "wall_s": round(time.monotonic() - t0, 1),
            "limit_s": round(limit, 1),
            "output_tail": text[-3000:],
            "watch": watch.summary(),
        }

    # -- steps ---------------------------------------------------------------------------------
    def env_step(self) -> dict[str, Any]:
        def sh(cmd: str) -> str:
            done = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=30)
            return (done.stdout + done.stderr).strip()[-2000:]

        return {
            "nvidia_smi": sh(
                "nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version,"
                "compute_mode --format=csv"
            ),
            "nvidia_smi_bar1": sh("nvidia-smi -q -d MEMORY | grep -A3 -i bar1"),
            "control": shutil.which("nvidia-cuda-mps-control", path=self.env["PATH"]),
            "cores": len(os.sched_getaffinity(0)),
            "meminfo": sh("grep -E 'MemTotal|MemAvailable|SwapTotal|Committed_AS' /proc/meminfo"),
            "ulimit_u": sh("ulimit -u"),
            "pid_max": sh("cat /proc/sys/kernel/pid_max"),
            "torch": sh(
                f"{sys.executable} -c 'import torch; print(torch.__version__, torch.version.cuda)'"
            ),
            "memgov_doctor": sh(f"cd {ROOT} && {sys.executable} -m memgov doctor | grep -i mps"),
        }

    def servers_step(self) -> dict[str, Any]:
        started = self.cli("mps", "start", "--daemons", "3", "--json")
        result: dict[str, Any] = {
            "start_rc": started.returncode,
            "start_stderr": started.stderr[-1000:],
        }
        clients: list[subprocess.Popen[str]] = []
        try:
            info = json.loads(started.stdout) if started.returncode == 0 else {}
            result["daemon_start_s"] = info.get("start_s")
            result["daemons"] = [
                {k: d.get(k) for k in ("daemon", "pipe", "daemon_pid")}
                for d in info.get("daemons", [])
            ]
            firsts = []
            with Watch(self.nvml) as watch:
                for d in info.get("daemons", []):
                    env = {
                        **self.env,
                        "CUDA_MPS_PIPE_DIRECTORY": d["pipe"],
                        "CUDA_MPS_LOG_DIRECTORY": d["log"],
                    }
                    pair = []
                    for _ in range(2):  # the first starts the daemon's server; the second not
                        t0 = time.monotonic()
                        proc = _client(env)
                        clients.append(proc)
                        line = _read_line(proc, 15)
                        pair.append({"line": line, "wall_s": round(time.monotonic() - t0, 3)})
                        if not line.startswith("ok"):
                            pair.append(pair[0])  # no second try on a daemon that failed one
                            break
                    firsts.append({"daemon": d["daemon"], "first": pair[0], "second": pair[1]})
                time.sleep(1.5)  # a sample with every server and client up
            result["clients"] = firsts
            result["watch"] = watch.summary()
            status = self.cli("mps", "status", "--json")
            if status.returncode == 0:
                result["status"] = {
                    k: v
                    for k, v in json.loads(status.stdout).items()
                    if k in ("running_daemons", "servers", "clients_per_gpu")
                }
        finally:
            _release_all(clients)
            stop = self.cli("mps", "stop", "--force", "--json")
            result["stop_rc"] = stop.returncode
            result["stop"] = stop.stdout[-1500:]
        return result

    def pack_step(
        self,
        n: int,
        *,
        mps: bool,
        limit: float,
        extra: list[str] | None = None,
        env: dict[str, str] | None = None,
        barrier_s: float | None = None,
        barrier_n: int | None = None,
    ) -> dict[str, Any]:
        # The barrier waits for every job's start-up, which grows with the step's time.
        barrier_s = barrier_s if barrier_s is not None else max(40.0, limit / 2)
        name = f"pack-{n}-{time.monotonic_ns()}"
        out = self.work / name
        size = n if not self.dry else min(n, 4)
        args = [
            "--n",
            str(size),
            "--no-solo",
            "--no-progress",
            "--out",
            str(out),
            "--timeout",
            str(int(limit - 25 if not self.dry else 60)),
            "--mps",
            "on" if mps and not self.dry else "off",
            *self.pack_args,
            *(extra or []),
        ]
        train = [
            "--epochs",
            str(EPOCHS),
            "--",
            "--limit",
            str(LIMIT if not self.dry else 256),
            "--eval-limit",
            "64",
            "--barrier",
            str(self.work / f"{name}-barrier"),
            "--barrier-n",
            str(min(size, barrier_n or size)),
            "--barrier-timeout",
            f"{barrier_s:g}",
        ]
        if self.dry:
            args += ["--device", "cpu"]
        argv = [sys.executable, "-m", "memgov", "pack", *args, str(MNIST), *train]
        ran = self.run_guarded(argv, limit, {**self.env, **(env or {})})
        ran["command"] = " ".join(["memgov pack", *args, "experiments/mnist", *train])
        ran["env"] = env or {}
        path = out / "report.json"
        ran["report"] = json.loads(path.read_text()) if path.exists() else None
        ran["figures"] = figures(ran["report"]) if ran["report"] else None
        return ran

    def wall_step(self) -> dict[str, Any]:
        # The third wave only when the steps after this one still fit.
        variants = [
            ("default", {}, 0),
            ("max_connections_1", {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}, 0),
            ("hold_0_mib", {"HOLD_MIB": "0"}, 220),
        ]
        n = 200 if not self.dry else 3
        found = {}
        for label, extra, keep in variants:
            if self.left() < 45 + keep and not self.dry:
                found[label] = {"skipped": f"{self.left():.0f} s of the budget left"}
                continue
            found[label] = self.wave(n, {**self.env, **extra}, limit=50 if not self.dry else 10)
            found[label]["env"] = extra
        return found

    def wave(self, n: int, env: dict[str, str], limit: float) -> dict[str, Any]:
        """Start ``n`` bare clients at once; count how many get a context before the GPU refuses."""
        lines: dict[int, str] = {}
        procs: list[subprocess.Popen[str]] = []
        stop = threading.Event()
        t0 = time.monotonic()

        def reader(i: int, proc: subprocess.Popen[str]) -> None:
            assert proc.stdout is not None
            line = proc.stdout.readline().strip()
            lines[i] = f"{line} @{time.monotonic() - t0:.2f}"

        with Watch(self.nvml, stop.set) as watch:
            for i in range(n):
                if stop.is_set():
                    break
                proc = _client(env)
                procs.append(proc)
                threading.Thread(target=reader, args=(i, proc), daemon=True).start()
            last, last_change = -1, time.monotonic()
            while time.monotonic() - t0 < limit and not stop.is_set():
                if len(lines) != last:
                    last, last_change = len(lines), time.monotonic()
                if len(lines) == len(procs) or time.monotonic() - last_change > 15:
                    break
                time.sleep(0.2)
            time.sleep(1.0)  # one more sample with everything held
        ok = sorted(float(v.rsplit("@", 1)[1]) for v in lines.values() if v.startswith("ok"))
        errors: dict[str, int] = {}
        first_error = None
        for v in lines.values():
            if v.startswith("err"):
                parts = v.split()
                key = f"{parts[1]} {parts[3]}" if len(parts) > 3 else v
                errors[key] = errors.get(key, 0) + 1
                first_error = first_error or v
        _release_all(procs)
        return {
            "clients": len(procs),
            "ok": len(ok),
            "errors": errors,
            "first_error": first_error,
            "no_answer": len(procs) - len(lines),
            "ok_at_s": _quantiles(ok),
            "wall_s": round(time.monotonic() - t0, 1),
            "watch": watch.summary(),
        }

    def hostmem_step(self) -> dict[str, Any]:
        found: dict[str, Any] = {}
        if self.dry:
            return {"skipped": "no GPU (dry run)"}
        variants = [
            ("lazy", {"CUDA_MODULE_LOADING": "LAZY"}),
            ("eager", {"CUDA_MODULE_LOADING": "EAGER"}),
        ]
        for label, extra in variants:
            found[label] = _probe(
                HOSTMEM, {**self.env, **extra, "OMP_NUM_THREADS": "1"}, min(40, self.left() - 10)
            )
        started = self.cli("mps", "start", "--json")
        try:
            info = json.loads(started.stdout) if started.returncode == 0 else {}
            if info.get("pipe"):
                found["mps_client"] = _probe(
                    HOSTMEM,
                    {
                        **self.env,
                        "OMP_NUM_THREADS": "1",
                        "CUDA_MPS_PIPE_DIRECTORY": info["pipe"],
                        "CUDA_MPS_LOG_DIRECTORY": info["log"],
                    },
                    min(40, self.left() - 10),
                )
        finally:
            self.cli("mps", "stop", "--force")
        return found


def _probe(code: str, env: dict[str, str], timeout: float = 40) -> dict[str, Any]:
    try:
        done = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=max(5.0, timeout),
            env=env,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {"rc": done.returncode, "stderr": done.stderr[-1500:]}


def _client(env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CLIENT],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
        start_new_session=True,
    )


def _read_line(proc: subprocess.Popen[str], timeout: float) -> str:
    box: list[str] = []
    reader = threading.Thread(
        target=lambda: box.append(proc.stdout.readline().strip() if proc.stdout else ""),
        daemon=True,
    )
    reader.start()
    reader.join(timeout)
    return box[0] if box else "no answer"


def _release_all(procs: list[subprocess.Popen[str]], grace: float = 10.0) -> None:
    """Close every client's stdin (it exits, its context goes); SIGKILL what is left after
    ``grace`` seconds in all (a client stuck in cuInit never reads its stdin)."""
    for proc in procs:
        with _quiet():
            if proc.stdin:
                proc.stdin.close()
    deadline = time.monotonic() + grace
    for proc in procs:
        try:
            proc.wait(max(0.01, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with _quiet():
                os.killpg(proc.pid, signal.SIGKILL)
    for proc in procs:
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:  # stuck in the driver (state D): leave it, say so
            print(f"client {proc.pid} did not exit after SIGKILL", flush=True)


class _quiet:
    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, *rest: object) -> bool:
        return kind is not None and issubclass(kind, (OSError, ValueError))  # type: ignore[arg-type]


def _quantiles(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"first": values[0], "median": round(statistics.median(values), 2), "last": values[-1]}


def _dist(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    ordered = sorted(values)
    return {
        "median": round(statistics.median(ordered), 3),
        "p90": round(ordered[int(0.9 * (len(ordered) - 1))], 3),
        "max": round(ordered[-1], 3),
    }


# -- figures of one pack report ------------------------------------------------------------------
def figures(report: dict[str, Any]) -> dict[str, Any]:
    jobs = report.get("jobs") or []
    ok = [j for j in jobs if j["status"] == "ok"]
    rogue = [j for j in jobs if j.get("rogue_mib")]
    over = [
        j["label"]
        for j in jobs
        if j.get("footprint_mib") and j.get("claim_mib") and j["footprint_mib"] > j["claim_mib"]
    ]
    daemons: dict[str, int] = {}
    for j in jobs:
        if j.get("mps_daemon") is not None:
            daemons[str(j["mps_daemon"])] = daemons.get(str(j["mps_daemon"]), 0) + 1
    started = [j for j in jobs if j.get("epochs_done")]
    return {
        "n": report.get("n"),
        "ok": report.get("ok"),
        "failed": report.get("failed"),
        "reasons": report.get("reasons"),
        "trained": len(started),
        "parallel": report.get("parallel"),
        "parallel_held_by": report.get("parallel_held_by"),
        "claim_mib": report.get("claim_mib"),
        "footprint_mib": report.get("footprint_mib"),
        "footprint_max_mib": report.get("footprint_max_mib"),
        "footprint_max_non_rogue_mib": max(
            (j["footprint_mib"] or 0) for j in jobs if not j.get("rogue_mib")
        )
        if jobs
        else None,
        "jobs_over_claim": over,
        "epoch_s": report.get("epoch_s"),
        "epoch_s_max": report.get("epoch_s_max"),
        "aggregate_samples_per_s": report.get("aggregate_samples_per_s"),
        "aggregate_basis": report.get("aggregate_basis"),
        "aggregate_samples_per_s_span": report.get("aggregate_samples_per_s_span"),
        "rate_while_90pct_trained": busy_rate(jobs, 0.9),
        "uss_per_job_mib": report.get("uss_per_job_mib"),
        "host_uss_peak_mib": report.get("host_uss_peak_mib"),
        "host_used_peak_mib": report.get("host_used_peak_mib"),
        "device_peak_used_mib": report.get("device_peak_used_mib"),
        "host_gate": report.get("host_gate"),
        "capacity": report.get("capacity"),
        "mps": report.get("mps"),
        "clients_per_daemon": daemons,
        "clients_per_daemon_at_once": at_once_per_daemon(jobs),
        "ready_s": _dist([j["ready_s"] for j in jobs if j.get("ready_s") is not None]),
        "admission": admissions(jobs),
        "ready_parts_s": {
            part: _dist(
                [
                    j["ready_parts_s"][part]
                    for j in jobs
                    if (j.get("ready_parts_s") or {}).get(part) is not None
                ]
            )
            for part in ("interpreter", "data", "framework")
        },
        "ok_job_epochs": len(ok),
        "rogue": [
            {
                k: j.get(k)
                for k in ("label", "status", "reason", "footprint_mib", "claim_mib", "claim_mode")
            }
            | {"detail": (j.get("detail") or "")[:300]}
            for j in rogue
        ],
        "first_failures": [
            {k: j.get(k) for k in ("label", "reason", "footprint_mib")}
            | {"detail": (j.get("detail") or "")[:300]}
            for j in jobs
            if j["status"] != "ok" and not j.get("rogue_mib")
        ][:5],
    }


def at_once_per_daemon(jobs: list[dict[str, Any]]) -> dict[str, int]:
    """Most jobs alive at the same moment per MPS daemon (``clients_per_daemon`` counts every
    job that ever joined one: jobs that ended free their slot for later ones)."""
    events = []
    for j in jobs:
        if j.get("mps_daemon") is not None and j.get("started_s") is not None:
            events += [
                (j["started_s"], 1, str(j["mps_daemon"])),
                (j["ended_s"] if j.get("ended_s") is not None else 1e18, -1, str(j["mps_daemon"])),
            ]
    now: dict[str, int] = {}
    most: dict[str, int] = {}
    for _, step, daemon in sorted(events, key=lambda e: (e[0], e[1])):  # ends first on a tie
        now[daemon] = now.get(daemon, 0) + step
        most[daemon] = max(most.get(daemon, 0), now[daemon])
    return most


ADMISSION = re.compile(
    r"memgov: admission: ([0-9.]+) s; (\d+) look\(s\) under the admission "
    r"lock, waited ([0-9.]+) s for it, held it at most ([0-9.]+) ms; "
    r"NVML ([0-9.]+) s"
)


def admissions(jobs: list[dict[str, Any]]) -> dict[str, Any]:
    """The admission lines of slow claims (>= 0.5 s; quicker ones print none) in the job logs."""
    found = []
    for j in jobs:
        try:
            text = Path(j["log"]).read_text(errors="replace") if j.get("log") else ""
        except OSError:
            continue
        found += [tuple(float(x) for x in m.groups()) for m in ADMISSION.finditer(text)]
    if not found:
        return {"slow": 0}
    return {
        "slow": len(found),
        "total_s": _dist([f[0] for f in found]),
        "lock_wait_s": _dist([f[2] for f in found]),
        "lock_held_max_ms": max(f[3] for f in found),
        "nvml_s": _dist([f[4] for f in found]),
    }


def busy_rate(jobs: list[dict[str, Any]], share: float) -> dict[str, Any] | None:
    """Samples/s of all jobs together at the moments when at least ``share`` of the jobs that
    trained at all were inside an epoch (each epoch's samples spread evenly over it): the median
    and max over 0.25 s steps, and for how long that held. Free of start-up stagger, unlike a
    window that needs every job at once."""
    spans = [s for j in jobs for s in (j.get("epoch_spans") or [])]
    trained = sum(1 for j in jobs if j.get("epoch_spans"))
    if not spans or not trained:
        return None
    lo, hi = min(s[0] for s in spans), max(s[1] for s in spans)
    rates, t = [], lo
    while t <= hi:
        inside = [s for s in spans if s[0] <= t < s[1]]
        if len(inside) >= share * trained:
            rates.append(sum(s[2] / (s[1] - s[0]) for s in inside if s[1] > s[0]))
        t += 0.25
    if not rates:
        return {"median": None, "max": None, "seconds": 0.0, "jobs": trained}
    return {
        "median": round(statistics.median(rates)),
        "max": round(max(rates)),
        "seconds": len(rates) * 0.25,
        "jobs": trained,
    }


# -- the table -----------------------------------------------------------------------------------
def table(results: dict[str, Any]) -> str:
    rows = [
        "step       ok/n     trained at-once held_by      daemons@once   claim  foot(max) "
        "epoch_s  agg/s(90%)  agg/s(pack)  USS/job  min_avail  reasons"
    ]
    for name, step in results["steps"].items():
        f = step.get("figures")
        if not f:
            continue
        busy = f["rate_while_90pct_trained"] or {}
        mps = f.get("mps") or {}
        spread = (
            json.dumps(f.get("clients_per_daemon_at_once") or f["clients_per_daemon"])
            if mps.get("used")
            else "-"
        )
        rows.append(
            f"{name:10} {f['ok']}/{f['n']:<5} {f['trained']:>7} {f['parallel']!s:>7} "
            f"{f['parallel_held_by']!s:12} {spread:14} "
            f"{f['claim_mib']!s:>6} {f['footprint_mib']!s:>6}"
            f"({f['footprint_max_non_rogue_mib']!s}) "
            f"{f['epoch_s']!s:>7} {busy.get('median')!s:>11} {f['aggregate_samples_per_s']!s:>12} "
            f"{f['uss_per_job_mib']!s:>8} {step['watch']['min_available_mib']!s:>9}  "
            f"{f['reasons']}"
        )
        ready, adm = f.get("ready_s") or {}, f.get("admission") or {}
        rows.append(
            f"{'':10} start-up s median {ready.get('median')} p90 {ready.get('p90')} "
            f"max {ready.get('max')}; slow admissions {adm.get('slow')}, lock wait max "
            f"{(adm.get('lock_wait_s') or {}).get('max')} s, held max "
            f"{adm.get('lock_held_max_ms')} ms, NVML max "
            f"{(adm.get('nvml_s') or {}).get('max')} s"
        )
        parts = f.get("ready_parts_s") or {}
        rows.append(
            f"{'':10} start-up medians: "
            + ", ".join(f"{k} {(v or {}).get('median')} s" for k, v in parts.items())
        )
    servers = results["steps"].get("servers") or {}
    if servers.get("clients"):
        rows.append(
            "server start: daemons "
            + json.dumps(servers.get("daemon_start_s"))
            + "; "
            + "; ".join(
                f"d{c['daemon']}: first client {c['first']['wall_s']} s, second "
                f"{c['second']['wall_s']} s"
                for c in servers["clients"]
            )
        )
        procs = (servers.get("watch") or {}).get("mps_processes") or {}
        rows.append(
            "MPS processes: "
            + "; ".join(
                f"{p['name']} gpu={p['gpu_mib']} rss={p['rss_mib']} uss={p['uss_mib']}"
                for p in procs.values()
            )
        )
    wall = results["steps"].get("wall") or {}
    for label, w in wall.items():
        if isinstance(w, dict) and "ok" in w:
            rows.append(
                f"wall {label}: {w['ok']}/{w['clients']} contexts, errors {w['errors']}, "
                f"no answer {w['no_answer']}, gpu peak {w['watch']['peak_gpu_used_mib']} "
                f"MiB, bar1 peak {w['watch']['peak_bar1_used_mib']} MiB, min avail "
                f"{w['watch']['min_available_mib']} MiB"
            )
    host = results["steps"].get("hostmem") or {}
    for label, h in host.items():
        if isinstance(h, dict) and "uss_mib" in h:
            rows.append(f"host USS {label}: {h['uss_mib']}")
    for name in ("mps140", "mps140auto"):
        rogue = (results["steps"].get(name) or {}).get("figures") or {}
        claim = ((results["steps"].get(name) or {}).get("report") or {}).get("claim") or {}
        if claim:
            rows.append(f"{name} claim: {claim.get('mib')} MiB ({claim.get('source')})")
        for r in rogue.get("rogue", []):
            rows.append(
                f"{name} rogue {r['label']}: {r['status']} {r['reason']} footprint "
                f"{r['footprint_mib']} MiB of claim {r['claim_mib']} ({r['claim_mode']}): "
                f"{r['detail'][:160]}"
            )
    if results["skipped"]:
        rows.append(f"skipped: {results['skipped']}")
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out")))
    parser.add_argument("--budget", type=float, default=500.0, help="seconds for every step")
    parser.add_argument(
        "--only",
        default=os.environ.get("ONLY", ""),
        help="comma- or space-separated steps (default all, in order)",
    )
    parser.add_argument(
        "--pack-args",
        default=os.environ.get("PACK_ARGS", "--runner preload"),
        help="more `memgov pack` options for every pack step, e.g. '--runner preload'",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="no GPU: tiny CPU packs and a stand-in control program",
    )
    args = parser.parse_args()
    wanted = [s for s in args.only.replace(",", " ").split() if s] or list(DEFAULT_STEPS)
    unknown = [s for s in wanted if s not in STEPS]
    if unknown:
        parser.error(f"unknown step(s) {unknown}; accepted: {', '.join(STEPS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="mg-dens-", dir="/tmp"))  # short: socket paths
    bench = Bench(args.out, args.budget, args.dry_run, work)
    bench.pack_args = args.pack_args.split()
    bench.results["pack_args"] = bench.pack_args
    spread = {"MEMGOV_MPS_POLICY": "spread"}
    actions = {
        "env": bench.env_step,
        "servers": bench.servers_step,
        "mps48": lambda: bench.pack_step(48, mps=True, limit=NEEDS["mps48"]),
        "mps96": lambda: bench.pack_step(96, mps=True, limit=NEEDS["mps96"]),
        # Claims of 1,000 MiB (the job's footprint is 886 MiB): 140 of pack's automatic
        # 1,039 MiB (footprint x 1.10 + 64 MiB) do not fit the card's 142,826 MiB of budget.
        "mps140": lambda: bench.pack_step(
            140, mps=True, limit=NEEDS["mps140"], extra=["--rogue", "1:4096", "--claim", "1000MiB"]
        ),
        # pack's own claim: made smaller so that 140 fit (docs/pack.md, --claim auto)
        "mps140auto": lambda: bench.pack_step(
            140, mps=True, limit=NEEDS["mps140auto"], extra=["--rogue", "1:4096"]
        ),
        "mps48x2": lambda: bench.pack_step(
            48, mps=True, limit=NEEDS["mps48x2"], extra=["--mps-daemons", "2"], env=spread
        ),
        "nomps140": lambda: bench.pack_step(
            140, mps=False, limit=NEEDS["nomps140"], env={"MEMGOV_CONTEXTS": "off"}, barrier_s=20
        ),
        "nomps48": lambda: bench.pack_step(48, mps=False, limit=NEEDS["nomps48"]),
        # 72 at once (MEMGOV_CONTEXTS), so the barrier waits for 72; the rest pass it at once.
        "nomps96": lambda: bench.pack_step(96, mps=False, limit=NEEDS["nomps96"], barrier_n=72),
        "wall": bench.wall_step,
        "hostmem": bench.hostmem_step,
        "nomps140q": lambda: bench.pack_step(
            140, mps=False, limit=NEEDS["nomps140q"], barrier_s=10
        ),
    }
    try:
        for name in STEPS:
            if name in wanted:
                bench.step(name, actions[name])
    finally:
        with _quiet():
            bench.cli("mps", "stop", "--force", timeout=60)  # nothing of ours left running
        bench.results["total_s"] = round(time.monotonic() - bench.t0, 1)
        bench.save()
        shutil.rmtree(work, ignore_errors=True)
    print("\n== mps density (raw: " + str(args.out / "mps_density.json") + ")")
    print(table(bench.results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
