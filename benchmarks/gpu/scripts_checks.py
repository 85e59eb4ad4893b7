"""N copies of an unchanged training script on one GPU: under memgov vs hand-tuned, alternated.

The scripts are other people's (the PyTorch examples, fetched; never copied into memgov) plus
this repository's plain loop in its Adam + pinned-gather form; each kind runs in every condition
of ``--conditions``, ``--rounds`` times, the order reversed every other round (hand, memgov,
memgov, hand, ...), so neither side always runs first on a cold GPU or second on a warm one, and
slow drift of the machine falls on both sides. Conditions:

  memgov_mps   MEMGOV_CLAIM=<the kind's claim> only, under a `memgov mps start` daemon
  hand_mps     OMP_NUM_THREADS=1, under an MPS daemon started by hand (private pipe/log folders)
  diagnostics (pick with --conditions): memgov_mps_fixed (+ MEMGOV_THREADS=1: no follower),
  memgov_mps_big (the claim + 1 GiB), hand_mps_cap (+ torch's allocator capped at the claim,
  PYTORCH_ALLOC_CONF=per_process_memory_fraction, as an expert would), memgov_soft (MEMGOV_CLAIM
  under the hand-started daemon: soft mode, no MPS memory limit), memgov_mps_omp1 (+
  OMP_NUM_THREADS=1: memgov leaves threads alone), hand_mps_limit (+ MPS's memory limit at the
  claim, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, as memgov sets it, with MEMGOV_CLAIM=off: memgov
  would read that variable as a scheduler's budget and govern), memgov_mps_passive (+
  OMP_WAIT_POLICY=PASSIVE: OpenMP's idle threads sleep at once instead of spinning),
  memgov_mps_nogrow (memgov's thread share followed down only: never grown into idle cores or
  a departed neighbour's share), hand_mps_cap_limit (hand_mps_cap with MPS's memory limit at
  the claim too: both of memgov's limits, no memgov), hand_mps_env (every variable a governed
  job ends up with after its claim, set by hand with memgov off: the thread variables at 1, the
  allocator cap, MPS's memory limit, CUDA_VISIBLE_DEVICES=<the GPU's UUID>, memgov's daemon),
  memgov_mps_noruns (memgov's claim starts no run: no sampler thread, live file or fold into the
  profile at exit), hand_mps_cap_batch and memgov_mps_batch (hand_mps_cap and memgov_mps with
  every thread SCHED_BATCH from the interpreter's start: a woken thread does not preempt the
  running one), mixed (one run, both sides at once: every
  other job governed as memgov_mps, the rest hand-tuned as hand_mps_cap, all clients of the one
  `memgov mps start` daemon; which half is governed alternates run by run. The two halves meet
  the same machine at the same moment, so a cost memgov adds to each job shows in the halves'
  medians however the machine drifts between runs; ``groups`` holds each half's medians)

Per run: the span from the first launch to the last exit (what a user waits for), every job's
exit status and wall time, NVML peak per job and of the device, and every stderr line that is
not the script's own: memgov's info lines (``memgov: ...``) are counted, anything else memgov
printed (a traceback, "Exception ignored") is listed. The plain loop also reports its epochs, so
its rates use threads_checks' bases. Raw JSON to OUT/scripts_<tag>.json.

Where a gap comes from, per job and as medians per run (``where``), from each job's progress
lines (every line is stamped with seconds since its launch; MNIST and VAE are given log intervals
of about ten lines an epoch, DCGAN prints one a step): ``start_s`` launch to the first training
line (interpreter, torch, CUDA, memgov's claim, data set-up, the first step), ``rate`` samples/s
between the first line past ``warm`` samples and the last one (steady training: DCGAN's epochs
after the first, MNIST's and VAE's epoch after its first 100 / 50 steps), ``after_s`` the last
training line to the exit (test pass, teardown, exit handlers); the job's CPU seconds and
context switches (its rusage, DataLoader workers included); and, from a probe that runs at the
job's exit (a ``sitecustomize`` on PYTHONPATH in every condition), torch's allocator counters
(``num_alloc_retries``: the allocator hit its cap or the device limit and freed its cache to
retry; ``num_device_alloc``/``free``) and torch's thread counts. The probe also stamps the
start-up (TIMELINE: wall and process CPU at each point, the same in every condition): ``import
torch`` begun and done (a governed job's share and claim within it), the script's
``torch.accelerator.is_available()`` (CUDA's driver initialised there), the model's first
``.to`` begun and done (where a script's first CUDA use makes the context; a governed job's
allocator cap runs inside it, its own points within), the DataLoader's first iterator and
batch, the first optimizer step.

    python3 benchmarks/gpu/scripts_checks.py --examples .public/examples \
        --kinds mnist,dcgan,vae --rounds 2 --budget 555 --out "$OUT"
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import threads_checks as tc
from _threads_rates import aggregate
from nvml import FootprintSampler

ROOT = Path(__file__).resolve().parents[2]

KINDS: dict[str, dict[str, Any]] = {
    # The PyTorch examples' MNIST: one persistent DataLoader worker, pinned memory, a test pass
    # with batches of 1,000 (peak 1,358 MiB alone on the H200: a 1 GiB claim is too small).
    # A progress line every 100 steps of 64 (each reads the loss: one sync per 100 steps).
    "mnist": {
        "script": "mnist/main.py",
        "args": ["--epochs", "1", "--log-interval", "100"],
        "claim": "1600MiB",
        "data": True,
        "progress": "epoch_line",
        "warm": 6400,
    },
    # DCGAN on FakeData: two DataLoader workers, two networks, Adam, cudnn.benchmark. Alone it
    # peaks at 3,338 MiB (NVML): cuDNN's benchmark tries algorithms with large workspaces. Under a
    # 1 GiB claim it ran (962 MiB) with slower ones: 0.92x of the uncapped hand-tuned copies.
    # It prints a line every step (16 steps of 64 an epoch: FakeData holds 1,000 images).
    # Three epochs (four until 2026-11-25): three kinds x two conditions x two rounds fit a call.
    "dcgan": {
        "script": "dcgan/main.py",
        "args": ["--dataset", "fake", "--niter", "3", "--accel", "--workers", "2"],
        "claim": "3584MiB",
        "data": False,
        "progress": "dcgan_line",
        "warm": 1000,
    },
    # The VAE example: a DataLoader worker, a test pass, images written with save_image. A
    # progress line every 50 steps of 128.
    "vae": {
        "script": "vae/main.py",
        "args": ["--epochs", "1", "--log-interval", "50"],
        "claim": "1GiB",
        "data": True,
        "progress": "epoch_line",
        "warm": 6400,
    },
    # This repository's plain loop (never imports memgov) in the shape that was slower: Adam,
    # batches gathered on the CPU from pinned host tensors.
    "pinned": {
        "script": None,
        "args": [
            "--optimizer",
            "adam",
            "--gather",
            "pinned",
            "--epochs",
            "8",
            "--steps",
            "500",
            "--device",
            "gpu",
        ],
        "claim": "1GiB",
        "data": False,
    },
}
CONDITIONS = (
    "hand_mps",
    "memgov_mps",
    "memgov_mps_fixed",
    "memgov_mps_big",
    "hand_mps_cap",
    "memgov_soft",
    "memgov_mps_omp1",
    "hand_mps_limit",
    "hand_mps_yield",
    "hand_mps_blocking",
    "memgov_mps_nonvml",
    "memgov_mps_passive",
    "memgov_mps_nogrow",
    "mixed",
    "hand_mps_cap_limit",
    "hand_mps_env",
    "memgov_mps_noruns",
    "hand_mps_cap_batch",
    "memgov_mps_batch",
)


def _cap(claim: str, total: int) -> dict[str, str]:
    """torch's allocator capped at the claim, as an expert keeping jobs apart sets it."""
    from memgov._base.sizes import parse_size

    return {"PYTORCH_ALLOC_CONF": f"per_process_memory_fraction:{parse_size(claim) / total:.4f}"}


def _mps_limit(claim: str) -> dict[str, str]:
    """MPS's memory limit at the claim, the value memgov sets (its own function), with memgov
    off: memgov reads that variable as a scheduler's budget and would govern."""
    from memgov._base.sizes import parse_size
    from memgov._gpu.enforce import PIN_ENV, pinned_limit

    return {PIN_ENV: pinned_limit(parse_size(claim), 0), "MEMGOV_CLAIM": "off"}


def _memgov_daemon(base: dict[str, str]) -> dict[str, str]:
    """What points a hand-tuned job at memgov's daemon 0 ($MEMGOV_DIR/mps/pipe and log,
    memgov/_gpu/mpsctl.py paths(); governed jobs find it themselves)."""
    root = Path(base["MEMGOV_DIR"]) / "mps"
    return {
        "CUDA_MPS_PIPE_DIRECTORY": str(root / "pipe"),
        "CUDA_MPS_LOG_DIRECTORY": str(root / "log"),
    }


def condition(name: str, claim: str, total: int) -> dict[str, Any]:
    """Environment and MPS daemon of one condition (threads_checks.mps_for starts the daemon)."""
    from memgov._base.sizes import parse_size
    from memgov._cpu.threads import ENV_VARS

    hand = {"OMP_NUM_THREADS": "1"}
    memgov = {"MEMGOV_CLAIM": claim}
    if name == "hand_mps":
        return {"what": f"{hand}, MPS by hand", "env": hand, "mps": "hand"}
    if name == "hand_mps_cap":
        env = {**hand, **_cap(claim, total)}
        return {"what": f"{env}, MPS by hand", "env": env, "mps": "hand"}
    if name == "memgov_mps":
        return {"what": f"{memgov}, `memgov mps start`", "env": memgov, "mps": "memgov"}
    if name == "memgov_mps_fixed":
        env = {**memgov, "MEMGOV_THREADS": "1"}
        return {"what": f"{env}, `memgov mps start`", "env": env, "mps": "memgov"}
    if name == "memgov_mps_big":
        env = {"MEMGOV_CLAIM": f"{(parse_size(claim) + 2**30) // 2**20}MiB"}
        return {"what": f"{env}, `memgov mps start`", "env": env, "mps": "memgov"}
    if name == "memgov_mps_omp1":  # the expert's thread setting: memgov leaves threads alone
        env = {**memgov, **hand}
        return {"what": f"{env}, `memgov mps start`", "env": env, "mps": "memgov"}
    if name == "hand_mps_limit":  # MPS's memory limit alone, as memgov sets it for the claim
        env = {**hand, **_mps_limit(claim)}
        return {"what": f"{env}, MPS by hand", "env": env, "mps": "hand"}
    if name == "hand_mps_cap_limit":  # both of memgov's memory limits, set by hand
        env = {**hand, **_cap(claim, total), **_mps_limit(claim)}
        return {"what": f"{env}, MPS by hand", "env": env, "mps": "hand"}
    if name == "hand_mps_env":  # every variable a governed job ends up with, memgov off
        env = {**dict.fromkeys(ENV_VARS, "1"), **_cap(claim, total), **_mps_limit(claim)}
        return {
            "what": f"{env}, CUDA_VISIBLE_DEVICES=<the GPU's UUID>, `memgov mps start`",
            "env": env,
            "mps": "memgov",
            "as_governed": True,
        }
    if name == "memgov_mps_passive":  # OpenMP's idle threads sleep at once instead of spinning
        env = {**memgov, "OMP_WAIT_POLICY": "PASSIVE"}
        return {"what": f"{env}, `memgov mps start`", "env": env, "mps": "memgov"}
    if name == "memgov_mps_nogrow":  # the share followed down only, never grown
        env = {**memgov, "SCRIPTS_NO_GROWTH": "1"}
        return {"what": f"{env}, `memgov mps start`", "env": env, "mps": "memgov"}
    if name == "memgov_mps_noruns":  # memgov's run sampler, live file and fold never start
        env = {**memgov, "SCRIPTS_NO_RUNS": "1"}
        return {"what": f"{env}, `memgov mps start`", "env": env, "mps": "memgov"}
    if name == "memgov_mps_nonvml":  # memgov's sampler without its NVML looks
        env = {**memgov, "SCRIPTS_NO_NVML": "1"}
        return {"what": f"{env}, `memgov mps start`", "env": env, "mps": "memgov"}
    if name in ("hand_mps_yield", "hand_mps_blocking"):  # CUDA's waits yield / block
        env = {**hand, "SCRIPTS_CUDA_SCHED": name.rsplit("_", 1)[1]}
        return {"what": f"{env}, MPS by hand", "env": env, "mps": "hand"}
    if name in ("hand_mps_cap_batch", "memgov_mps_batch"):  # every thread SCHED_BATCH
        env = {**(hand if name.startswith("hand") else memgov), "SCRIPTS_SCHED_BATCH": "1"}
        if name.startswith("hand"):
            env.update(_cap(claim, total))
        mps = "hand" if name.startswith("hand") else "memgov"
        return {"what": f"{env}, SCHED_BATCH from the interpreter's start", "env": env, "mps": mps}
    if name == "mixed":  # the hand-tuned half joins memgov's daemon: see run()
        hand_cap = {**hand, **_cap(claim, total)}
        return {
            "what": f"every other job {memgov}, the rest {hand_cap}; `memgov mps start`",
            "env": {},
            "mps": "memgov",
            "halves": {"memgov": memgov, "hand": hand_cap},
        }
    if name == "memgov_soft":
        return {"what": f"{memgov}, MPS by hand (soft claims)", "env": memgov, "mps": "hand"}
    raise SystemExit(f"--conditions: {name!r}; accepted {', '.join(CONDITIONS)}")


def _as_governed(cond: dict[str, Any], base: dict[str, str]) -> dict[str, str]:
    """hand_mps_env: the rest of what a governed job's environment holds after its claim (the
    GPU by UUID, as memgov names it, and memgov's daemon, which governed jobs find themselves)."""
    if not cond.get("as_governed"):
        return {}
    import pynvml

    uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(0))
    gpu = uuid if isinstance(uuid, str) else uuid.decode()
    return {"CUDA_VISIBLE_DEVICES": gpu, **_memgov_daemon(base)}


def write_mnist_raw(npz: Path, folder: Path) -> None:
    """torchvision's MNIST reads ``<root>/MNIST/raw/*-ubyte``; written from the shared npz (the
    machine has no network, and torchvision checks these files before downloading)."""
    import numpy as np

    raw = folder / "MNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    with np.load(npz) as data:
        arrays = {
            "train-images-idx3-ubyte": data["x_train"],
            "train-labels-idx1-ubyte": data["y_train"],
            "t10k-images-idx3-ubyte": data["x_test"],
            "t10k-labels-idx1-ubyte": data["y_test"],
        }
    for name, array in arrays.items():
        array = np.ascontiguousarray(array, dtype=np.uint8)
        magic = (0x0803 if array.ndim == 3 else 0x0801).to_bytes(4, "big")
        dims = b"".join(int(d).to_bytes(4, "big") for d in array.shape)
        payload = magic + dims + array.tobytes()
        (raw / name).write_bytes(payload)
        with gzip.open(raw / f"{name}.gz", "wb") as f:  # older torchvision looks for these
            f.write(payload)


def job_command(kind: dict[str, Any], examples: Path, report: Path) -> list[str]:
    if kind["script"] is None:
        return [
            sys.executable,
            str(ROOT / "benchmarks" / "workloads" / "plain_torch_mnist.py"),
            *kind["args"],
            "--out",
            str(report),
        ]
    return [sys.executable, str(examples / kind["script"]), *kind["args"]]


def foreign_lines(log: str) -> tuple[int, list[str]]:
    """(memgov info lines, lines that look like an error of memgov's or a traceback)."""
    lines = [
        x.split(" ", 1)[-1] if x[:1] == " " or x[:1].isdigit() else x
        for x in (y.lstrip() for y in log.splitlines())
    ]
    info = sum(1 for x in lines if x.startswith("memgov:"))
    suspect = [
        x
        for x in lines
        if ("memgov" in x and not x.startswith("memgov:"))
        or x.startswith(("Traceback", "Exception ignored"))
    ]
    return info, suspect[:10]


def _stamp(
    proc: subprocess.Popen[bytes], path: Path, launched: float, firsts: dict[int, float]
) -> None:
    """Copy the job's output to its log, each line stamped with seconds since its launch; the
    first line's time (torch imported, device chosen: e.g. vae's "Using device") goes in
    ``firsts``, so start-up and training can be told apart in scripts that time nothing."""
    assert proc.stdout is not None
    with open(path, "w") as log:
        for raw in proc.stdout:
            now = time.time()
            firsts.setdefault(proc.pid, now - launched)
            log.write(f"{now - launched:8.3f} {raw.decode(errors='replace')}")


PROGRESS = {
    # mnist, vae: "Train Epoch: 1 [6400/60000 (11%)]\tLoss: ..." (samples before this step)
    "epoch_line": re.compile(r"Train Epoch: (\d+) \[(\d+)/(\d+)"),
    # dcgan: "[0/4][3/16] Loss_D: ..." (epoch from 0, step, steps an epoch)
    "dcgan_line": re.compile(r"^\[(\d+)/\d+\]\[(\d+)/(\d+)\]"),
}
DCGAN_IMAGES, DCGAN_BATCH = 1000, 64
"""dset.FakeData's default size and dcgan/main.py's default batch."""


def progress(kind: dict[str, Any], log: str) -> list[tuple[float, int]]:
    """(seconds since launch, samples trained) at each progress line of a stamped job log."""
    pattern = PROGRESS[kind["progress"]]
    points = []
    for raw in log.splitlines():
        stamp, _, text = raw.strip().partition(" ")
        found = pattern.search(text.strip())
        if found is None:
            continue
        try:
            seconds = float(stamp)
        except ValueError:
            continue
        a, b, c = (int(x) for x in found.groups())
        if kind["progress"] == "epoch_line":
            samples = (a - 1) * c + b
        else:
            samples = a * DCGAN_IMAGES + min((b + 1) * DCGAN_BATCH, DCGAN_IMAGES)
        points.append((seconds, samples))
    return points


def phases(kind: dict[str, Any], log: str, wall: float) -> dict[str, Any]:
    """Where a job's time went: launch to its first training line (``start_s``), samples/s
    past ``warm`` (``rate``), its last training line to its exit (``after_s``), and its last
    line of any kind to its exit (``exit_s``: teardown and exit handlers)."""
    last = None
    for line in log.splitlines():
        with contextlib.suppress(ValueError, IndexError):
            last = float(line.split()[0])
    out: dict[str, Any] = {"exit_s": round(wall - last, 2) if last is not None else None}
    if kind["script"] is None:
        return out
    points = progress(kind, log)
    out["progress_lines"] = len(points)
    if not points:
        return out
    out["start_s"] = round(points[0][0], 2)
    out["after_s"] = round(wall - points[-1][0], 2)
    steady = [p for p in points if p[1] >= kind["warm"]]
    if len(steady) >= 2 and steady[-1][0] > steady[0][0]:
        seconds = steady[-1][0] - steady[0][0]
        out["rate"] = round((steady[-1][1] - steady[0][1]) / seconds, 1)
        out["steady_s"] = round(seconds, 2)
    return out


PROBE = '''"""scripts_checks.py's exit probe, on PYTHONPATH in every condition: at the job's exit,
torch's allocator counters and thread counts go to $SCRIPTS_PROBE_DIR/<pid>.json. The
sitecustomize it shadows (if any) still runs."""
import atexit, importlib.machinery, importlib.util, json, os, sys

KEYS = ("num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free",
        "reserved_bytes.all.peak", "allocated_bytes.all.peak")


def _chain():
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if p and os.path.abspath(p) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


def _dump():
    folder = os.environ.get("SCRIPTS_PROBE_DIR")
    torch = sys.modules.get("torch")
    if not folder or torch is None:
        return
    info = {"pid": os.getpid()}
    try:
        info["threads"] = torch.get_num_threads()
        info["interop_threads"] = torch.get_num_interop_threads()
        info["omp_env"] = os.environ.get("OMP_NUM_THREADS")
        if torch.cuda.is_initialized():
            stats = torch.cuda.memory_stats()
            info.update({key: stats.get(key) for key in KEYS})
            info["cudnn_benchmark"] = bool(torch.backends.cudnn.benchmark)
    except Exception as exc:
        info["error"] = repr(exc)
    info.update(_snapshot)
    with open(os.path.join(folder, "%d.json" % os.getpid()), "w") as f:
        json.dump(info, f)


def _threads_cpu():
    """CPU seconds of every thread still alive when threading shuts down (before atexit: the
    daemon threads of memgov and torch still run): Python threads by name, the rest by comm."""
    import resource, threading, time
    names = {t.ident: t.name for t in threading.enumerate()}
    runs = sys.modules.get("memgov._runs")
    run = getattr(runs, "_run", None) if runs else None
    if run is not None and getattr(run, "sampler", None):
        names.setdefault(run.sampler, "memgov-sampler")
    py = {}
    for ident in sys._current_frames():
        try:
            seconds = time.clock_gettime(time.pthread_getcpuclockid(ident))
        except (OSError, OverflowError, AttributeError):
            continue
        name = names.get(ident, "python-unnamed")
        py[name] = round(py.get(name, 0.0) + seconds, 3)
    comm = {}
    tick = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir("/proc/self/task"):
        try:
            with open("/proc/self/task/%s/stat" % tid) as f:
                text = f.read()
        except OSError:
            continue
        name = text[text.index("(") + 1:text.rindex(")")]
        fields = text[text.rindex(")") + 2:].split()
        comm[name] = round(comm.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick, 2)
    me = resource.getrusage(resource.RUSAGE_SELF)
    _snapshot.update(python_threads_cpu_s=py, tasks_cpu_s_by_comm=comm,
                     tasks=len(os.listdir("/proc/self/task")),
                     self_cpu_s_at_shutdown=round(me.ru_utime + me.ru_stime, 2),
                     shutdown_s=round(time.time() - _T0, 2))


_snapshot = {}
_T0 = __import__("time").time()


def _dump_all():
    import resource
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    _snapshot.update(self_cpu_s=round(me.ru_utime + me.ru_stime, 2),
                     children_cpu_s=round(kids.ru_utime + kids.ru_stime, 2))
    _dump()


def _full_collections():
    """The collector's full collections in this process, any thread, launch to exit, and the
    CPU of the thread that ran each (a governed job freezes the framework's objects after its
    import: memgov/_autoenable.py; a full collection then skips them)."""
    import gc, time
    full = {"n": 0, "cpu_s": 0.0}
    began = [0.0]

    def on_gc(phase, info):
        if info.get("generation") != 2:
            return
        if phase == "start":
            began[0] = time.thread_time()
            return
        full["n"] += 1
        full["cpu_s"] += time.thread_time() - began[0]
        _snapshot["gc_full_n"] = full["n"]
        _snapshot["gc_full_cpu_s"] = round(full["cpu_s"], 4)

    gc.callbacks.append(on_gc)


def _register_shutdown():
    import threading
    try:
        threading._register_atexit(_threads_cpu)
    except Exception:
        pass


def _cuda_sched():
    """SCRIPTS_CUDA_SCHED=yield|blocking: once torch has initialised CUDA, set the primary
    context's scheduling flags (cuCtxSetFlags; CUDA's default spins while this process alone
    has fewer contexts than the host has CPUs, however many processes share those CPUs)."""
    mode = os.environ.get("SCRIPTS_CUDA_SCHED", "")
    flags = {"yield": 2, "blocking": 4}.get(mode)
    if flags is None:
        return
    import ctypes, threading, time

    def watch():
        while True:
            torch = sys.modules.get("torch")
            try:
                if torch is not None and torch.cuda.is_initialized():
                    break
            except Exception:
                pass
            time.sleep(0.02)
        cuda = ctypes.CDLL("libcuda.so.1")
        dev, ctx, out, got = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_uint()
        steps = [cuda.cuDeviceGet(ctypes.byref(dev), 0),
                 cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev),
                 cuda.cuCtxPushCurrent_v2(ctx), cuda.cuCtxSetFlags(flags),
                 cuda.cuCtxGetFlags(ctypes.byref(got)),
                 cuda.cuCtxPopCurrent_v2(ctypes.byref(out)),
                 cuda.cuDevicePrimaryCtxRelease_v2(dev)]
        _snapshot["cuda_sched"] = {"mode": mode, "results": steps, "flags": got.value}

    threading.Thread(target=watch, name="probe-sched", daemon=True).start()


def _sched_batch():
    """SCRIPTS_SCHED_BATCH=1: the interpreter's first thread SCHED_BATCH (as `chrt --batch 0`
    would launch it); every thread and child made after inherits it. A batch task woken does
    not preempt the running one: fewer forced switches on a host with more runnable threads
    than cores."""
    if os.environ.get("SCRIPTS_SCHED_BATCH") != "1":
        return
    try:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
        _snapshot["sched"] = os.sched_getscheduler(0)
    except OSError as exc:
        _snapshot["sched"] = repr(exc)


def _startup_samples():
    """SCRIPTS_STARTUP_SAMPLES=MS: until the first optimizer step, every MS milliseconds, the
    main thread's CPU seconds since the last look are put on what its stack shows now: the
    script's own line (the frame of the file run as __main__), the innermost frame, and
    memgov's innermost frame where one is on the stack. Plus the collector's collections and
    the main thread's CPU in them. Where a start-up's CPU goes, by Python frame, in every
    condition alike."""
    every = os.environ.get("SCRIPTS_STARTUP_SAMPLES")
    if not every:
        return
    import gc, threading, time
    period = float(every) / 1000
    main = threading.main_thread()
    clock = time.pthread_getcpuclockid(main.ident)
    script, leaf, ours = {}, {}, {}
    collected = {"n": 0, "full": 0, "cpu_s": 0.0}
    began = [0.0]

    def on_gc(phase, info):
        if threading.current_thread() is not main:
            return
        if phase == "start":
            began[0] = time.thread_time()
            return
        collected["n"] += 1
        collected["full"] += info.get("generation") == 2
        collected["cpu_s"] += time.thread_time() - began[0]

    gc.callbacks.append(on_gc)

    def where(frame):
        inner = "%s:%s" % (os.path.basename(frame.f_code.co_filename), frame.f_code.co_name)
        line, memgov = None, None
        while frame is not None:
            name = frame.f_code.co_filename
            if frame.f_globals.get("__name__") == "__main__" and line is None:
                line = "%s:%d" % (os.path.basename(name), frame.f_lineno)
            # memgov's innermost frame; its import hook's loader runs the whole of `import
            # torch` inside it, so it names memgov's part only where nothing else of it does
            module = str(frame.f_globals.get("__name__", ""))
            hook = module == "memgov._base.importhook"
            if memgov is None and module.startswith("memgov") and not hook:
                memgov = "%s:%s" % (os.path.basename(name), frame.f_code.co_name)
            frame = frame.f_back
        return inner, line or "(before the script)", memgov

    def add(table, key, seconds):
        table[key] = table.get(key, 0.0) + seconds

    def watch():
        last = time.clock_gettime(clock)
        deadline = time.monotonic() + 120
        while "first_step" not in _snapshot.get("timeline", {}) and time.monotonic() < deadline:
            time.sleep(period)
            try:
                now = time.clock_gettime(clock)
                frame = sys._current_frames().get(main.ident)
            except Exception:
                break
            spent, last = now - last, now
            if frame is None or spent <= 0:
                continue
            inner, line, memgov = where(frame)
            add(leaf, inner, spent)
            add(script, line, spent)
            if memgov:
                add(ours, memgov, spent)
        gc.callbacks.remove(on_gc)

        def top(table):
            ranked = sorted(table.items(), key=lambda kv: -kv[1])[:60]
            return {k: round(v, 4) for k, v in ranked}

        collected["cpu_s"] = round(collected["cpu_s"], 4)
        _snapshot["startup_samples"] = {"every_ms": float(every), "by_script_line": top(script),
                                        "by_inner_frame": top(leaf), "in_memgov": top(ours),
                                        "gc": collected}

    threading.Thread(target=watch, name="probe-samples", daemon=True).start()


# Diagnostic conditions: a variable set to 1 replaces one piece of memgov in this process, to
# see whether that piece costs the job anything (memgov module, attribute, replacement):
# SCRIPTS_NO_NVML: the run sampler never asks NVML for this process's footprint (it falls back
# on torch's counters); SCRIPTS_NO_GROWTH: the follower lowers this process's threads when
# neighbours arrive but never raises them; SCRIPTS_NO_RUNS: the claim starts no run (no sampler
# thread, no live file, no fold into the profile at exit).
_PATCHES = {
    "SCRIPTS_NO_NVML": ("_gpu.nvml", "processes", lambda: lambda *args, **kwargs: None),
    "SCRIPTS_NO_GROWTH": (
        "_cpu.threads",
        "_Growth",
        lambda: type("NoGrowth", (__import__("memgov._cpu.threads")._cpu.threads._Growth,), {
            "target": lambda self, wanted, fair, now, neighbours=1: min(wanted, fair),
        }),
    ),
    "SCRIPTS_NO_RUNS": ("_runs", "start", lambda: lambda *args, **kwargs: None),
}


def _patch():
    for variable, (module, attribute, replacement) in _PATCHES.items():
        if os.environ.get(variable) != "1":
            continue
        try:
            import importlib
            setattr(importlib.import_module(f"memgov.{module}"), attribute, replacement())
        except Exception:
            pass


def _stamp(name):
    """One point of the job's timeline: wall time (epoch, the parent subtracts the launch) and
    this process's CPU seconds so far; the first of each name is kept."""
    import time
    _snapshot.setdefault("timeline", {}).setdefault(
        name, [round(time.time(), 4), round(time.process_time(), 3)])


def _timeline():
    """Stamps where a start-up goes, the same in every condition: the interpreter reaching this
    file ("site"), ``import torch`` begun and done (memgov's hook, which runs inside it for a
    governed job, included), torch's CUDA initialisation done (its queued calls, memgov's
    allocator cap among them, run before this one) and the first optimizer step done. A finder
    ahead of the others wraps torch's loader; it asks the finders behind it (memgov's among
    them) for the spec, so what they wrap still runs."""
    import sys as _sys
    _stamp("site")

    class _After:  # duck-typed, as memgov's own: importlib.abc is slow to import
        def find_spec(self, name, path=None, target=None):
            if name != "torch":
                return None
            _sys.meta_path.remove(self)
            for finder in _sys.meta_path:
                spec = getattr(finder, "find_spec", lambda *a: None)(name, path, target)
                if spec is not None:
                    break
            else:
                return None
            inner = spec.loader
            outer = type("TimedLoader", (), {
                "create_module": lambda self, spec: inner.create_module(spec),
                "exec_module": lambda self, module: _timed_exec(inner, module),
            })()
            spec.loader = outer
            return spec

    _sys.meta_path.insert(0, _After())
    auto = _sys.modules.get("memgov._autoenable")  # imported at start-up when governed
    if auto is not None:
        _wrap_first(auto, "_decide_threads", "share_begun", "share_done")
        _wrap_first(auto, "_govern", "claim_begun", "claim_done")


def _timed_exec(inner, module):
    _stamp("torch_begun")
    inner.exec_module(module)
    _stamp("torch_done")
    try:
        module.cuda._lazy_call(lambda: _stamp("cuda_ready"))
        handle = []

        def first_step(optimizer, args, kwargs):
            _stamp("first_step")
            handle[0].remove()

        from torch.optim.optimizer import register_optimizer_step_post_hook
        handle.append(register_optimizer_step_post_hook(first_step))
        _between(module)
    except Exception as exc:
        _snapshot["timeline_error"] = repr(exc)


def _wrap_first(owner, attribute, begun, done):
    """Stamp ``begun`` and ``done`` around the first call of owner.attribute (later calls pass
    straight through)."""
    inner = getattr(owner, attribute)

    def wrapper(*args, **kwargs):
        if done in _snapshot.get("timeline", {}):
            return inner(*args, **kwargs)
        if begun:
            _stamp(begun)
        try:
            return inner(*args, **kwargs)
        finally:
            _stamp(done)

    setattr(owner, attribute, wrapper)


def _between(torch):
    """The steps between CUDA's first use and the first optimizer step, alike in every
    condition: the model's first ``.to`` (where a script's first CUDA use makes the context; a
    governed job's allocator cap runs inside it), in it memgov's cap's context and its
    fraction set (governed only), the DataLoader's first iterator (its workers started) and
    first batch."""
    _wrap_first(torch.accelerator, "is_available", "accel_begun", "accel_done")
    _wrap_first(torch.nn.Module, "to", "to_begun", "to_done")
    _wrap_first(torch.cuda, "mem_get_info", "", "cap_context_done")
    _wrap_first(torch.cuda, "set_per_process_memory_fraction", "cap_fraction_begun", "cap_done")
    import torch.utils.data.dataloader as loader
    _wrap_first(loader.DataLoader, "__iter__", "", "loader_iter_done")
    _wrap_first(loader._BaseDataLoaderIter, "__next__", "", "first_batch")


atexit.register(_dump_all)
_register_shutdown()
_full_collections()
_sched_batch()
_timeline()
_cuda_sched()
_startup_samples()
_patch()
try:
    _chain()
except Exception:
    pass
'''


def probe_env(work: Path, env: dict[str, str]) -> dict[str, str]:
    """The environment with the exit probe on PYTHONPATH (the same in every condition)."""
    folder = work / "probe"
    if not (folder / "sitecustomize.py").exists():
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "sitecustomize.py").write_text(PROBE)
    (work / "probe-out").mkdir(exist_ok=True)
    path = [str(folder), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])]
    return {
        **env,
        "PYTHONPATH": os.pathsep.join(path),
        "SCRIPTS_PROBE_DIR": str(work / "probe-out"),
        # Stamps are when a line reaches the pipe: block-buffered stdout would stamp a script's
        # lines when its buffer fills (memgov's lines, on stderr, are never buffered).
        "PYTHONUNBUFFERED": "1",
    }


def _launch(
    kind: dict[str, Any], args: argparse.Namespace, folder: Path, envs: list[dict[str, str]]
) -> tuple[
    list[tuple[subprocess.Popen[bytes], Path, float]], list[threading.Thread], dict[int, float]
]:
    """Start the N copies (job i with ``envs[i]``); each one's output is stamped into its log by a
    reader thread."""
    procs, readers = [], []
    firsts: dict[int, float] = {}
    LIVE.clear()
    for i in range(args.n):
        cwd = folder / f"job{i:02d}"
        (cwd / "results").mkdir(parents=True)  # vae writes its images there
        cmd = job_command(kind, args.examples.resolve(), cwd / "report.json")
        started = time.time()
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            env=envs[i],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        reader = threading.Thread(
            target=_stamp, args=(proc, cwd / "log", started, firsts), daemon=True
        )
        reader.start()
        readers.append(reader)
        procs.append((proc, cwd, started))
        LIVE.append(proc)
    return procs, readers, firsts


LIVE: list[subprocess.Popen[bytes]] = []
"""The jobs of the run in progress: killed when the call ends early (SIGTERM from a time limit)."""


def _kill_live() -> None:
    for proc in LIVE:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)


def _wait_all(
    procs: list[tuple[subprocess.Popen[bytes], Path, float]], timeout: float
) -> tuple[dict[int, float], dict[int, dict[str, float]]]:
    """Reap every job (wait4: its rusage, DataLoader workers included) until ``timeout``; kill
    the rest. Returns (pid -> exit time, pid -> CPU seconds and context switches)."""
    deadline = time.monotonic() + timeout
    ended: dict[int, float] = {}
    usage: dict[int, dict[str, float]] = {}
    while len(ended) < len(procs) and time.monotonic() < deadline:
        for proc, _, _ in procs:
            if proc.pid in ended:
                continue
            pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                ended[pid] = time.time()
                proc.returncode = os.waitstatus_to_exitcode(status)
                usage[pid] = {
                    "cpu_s": round(ru.ru_utime + ru.ru_stime, 2),
                    "sys_s": round(ru.ru_stime, 2),
                    "voluntary_switches": ru.ru_nvcsw,
                    "forced_switches": ru.ru_nivcsw,
                }
        time.sleep(0.05)
    for proc, _, _ in procs:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return ended, usage


def _job(
    kind: dict[str, Any],
    entry: tuple[subprocess.Popen[bytes], Path, float],
    ended: dict[int, float],
    usage: dict[int, dict[str, float]],
    firsts: dict[int, float],
    probes: Path,
) -> dict[str, Any]:
    proc, cwd, started = entry
    text = (cwd / "log").read_text(errors="replace")
    info, suspect = foreign_lines(text)
    doc: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        doc = json.loads((cwd / "report.json").read_text())
    probe: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        probe = json.loads((probes / f"{proc.pid}.json").read_text())
    wall = ended.get(proc.pid, time.time()) - started
    return {
        "rc": proc.returncode,
        "launched": started,
        "wall_s": round(wall, 2),
        "first_output_s": round(firsts.get(proc.pid, -1.0), 2),
        **phases(kind, text, wall),
        **usage.get(proc.pid, {}),
        "probe": probe,
        "memgov_info_lines": info,
        "suspect_lines": suspect,
        "tail": text.splitlines()[-4:] if proc.returncode else [],
        # The first lines, stamped (seconds since launch): where start-up goes, line by line.
        "head": [line[:160] for line in text.splitlines()[:8]],
        "ok": proc.returncode == 0,
        "epochs": doc.get("epochs", []),
        "allocator": doc.get("allocator"),
    }


def run(
    kind_name: str,
    cond_name: str,
    args: argparse.Namespace,
    work: Path,
    hand_daemon: dict[str, Any],
    total: int,
) -> dict[str, Any]:
    kind = KINDS[kind_name]
    cond = condition(cond_name, kind["claim"], total)
    folder = work / f"{kind_name}-{cond_name}-{time.monotonic_ns()}"
    folder.mkdir(parents=True)
    if kind["data"]:
        (folder / "data").symlink_to(work / "data")
    base = tc.base_env(work, False)
    if args.startup_samples:  # the probe's start-up samples, in every condition alike
        base["SCRIPTS_STARTUP_SAMPLES"] = f"{args.startup_samples:g}"
    with tc.mps_for(cond, base, work, hand_daemon):
        extra = {**cond.get("env_extra", {}), **_as_governed(cond, base)}
        env = probe_env(work, {**base, **cond["env"], **extra})
        groups = _halves(cond, env, base, args.n)
        envs = [e for _, e in groups] if groups else [env] * args.n
        sampler = FootprintSampler()
        launch = time.time()
        with sampler:
            procs, readers, firsts = _launch(kind, args, folder, envs)
            ended, usage = _wait_all(procs, args.job_timeout)
            for reader in readers:
                reader.join(timeout=10)
    jobs = [_job(kind, e, ended, usage, firsts, work / "probe-out") for e in procs]
    for job, (proc, _, _) in zip(jobs, procs, strict=True):
        job["nvml_peak_mib"] = round(sampler.peaks.get(proc.pid, 0) / 2**20, 1)
    for job, (group, _) in zip(jobs, groups, strict=False):
        job["group"] = group
    last = max(ended.values(), default=time.time())
    result = {
        "kind": kind_name,
        "condition": cond_name,
        "what": cond["what"],
        "mps_start": cond.get("mps_start"),
        "ok": sum(j["ok"] for j in jobs),
        "n": len(jobs),
        "span_s": round(last - launch, 2),
        "wall_s_median": round(statistics.median(j["wall_s"] for j in jobs), 2),
        "where": where(jobs),
        "first_output_s": sorted(j["first_output_s"] for j in jobs),
        "device_peak_mib": round(sampler.device_peak / 2**20, 1),
        "suspect_lines": sorted({x for j in jobs for x in j["suspect_lines"]})[:10],
        "jobs": jobs,
    }
    if groups:
        result["groups"] = {
            name: {
                "n": len(mine),
                "ok": sum(j["ok"] for j in mine),
                "last_exit_s": round(max(j["launched"] + j["wall_s"] for j in mine) - launch, 2),
                "wall_s_median": round(statistics.median(j["wall_s"] for j in mine), 2),
                **where(mine),
            }
            for name in ("memgov", "hand")
            if (mine := [j for j in jobs if j.get("group") == name])
        }
    if kind["script"] is None:
        result["rates"] = {
            k: v
            for k, v in aggregate(jobs, launch).items()
            if k.startswith(("samples_per_s", "span", "ok", "n"))
        }
    return result


_MIXED_RUNS = [0]
"""Mixed runs so far: which half is governed alternates (even jobs in the first run, odd ones
in the next), so neither half always holds the first launch."""


def _halves(
    cond: dict[str, Any], env: dict[str, str], base: dict[str, str], n: int
) -> list[tuple[str, dict[str, str]]]:
    """A mixed run's (half, environment) for each job; [] for every other condition. The
    hand-tuned half is pointed at memgov's daemon (governed jobs find it themselves)."""
    halves = cond.get("halves")
    if not halves:
        return []
    first = _MIXED_RUNS[0] % 2
    _MIXED_RUNS[0] += 1
    daemon = _memgov_daemon(base)
    out = []
    for i in range(n):
        if i % 2 == first:
            out.append(("memgov", {**env, **halves["memgov"]}))
        else:
            out.append(("hand", {**env, **halves["hand"], **daemon}))
    return out


WHERE = ("start_s", "rate", "after_s", "exit_s", "cpu_s", "sys_s", "voluntary_switches")


def where(jobs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the jobs of each phase (see phases()), and the probes' allocator retries
    (summed) and thread counts (the set seen)."""
    out: dict[str, Any] = {}
    for key in WHERE:
        values = [j[key] for j in jobs if j.get(key) is not None]
        if values:
            out[f"{key}_median"] = round(statistics.median(values), 2)
    probes = [j["probe"] for j in jobs if j.get("probe")]
    out["probes"] = len(probes)
    for key in ("num_alloc_retries", "num_ooms"):
        out[key] = sum(p.get(key) or 0 for p in probes)
    out["device_frees_median"] = (
        statistics.median(p.get("num_device_free") or 0 for p in probes) if probes else None
    )
    # Where the job's CPU went, from the probe: the process and its reaped children (DataLoader
    # workers), and each thread alive when threading shut down (Python ones by name).
    for key in ("self_cpu_s", "children_cpu_s", "self_cpu_s_at_shutdown", "tasks", "shutdown_s",
                "gc_full_n", "gc_full_cpu_s"):  # fmt: skip
        values = [p[key] for p in probes if p.get(key) is not None]
        if values:
            out[f"{key}_median"] = round(statistics.median(values), 3)
    for group in ("python_threads_cpu_s", "tasks_cpu_s_by_comm"):
        names = sorted({n for p in probes for n in p.get(group) or {}})
        out[group] = {
            n: round(statistics.median((p.get(group) or {}).get(n, 0.0) for p in probes), 2)
            for n in names
        }
    out["cuda_sched_seen"] = sorted(
        {str((p.get("cuda_sched") or {}).get("flags")) for p in probes if p.get("cuda_sched")}
    )
    # "intra-op/inter-op" as torch reported them at exit.
    out["threads_seen"] = sorted({f"{p.get('threads')}/{p.get('interop_threads')}" for p in probes})
    out["timeline"] = timeline(jobs)
    return out


TIMELINE = (
    "site",
    "torch_begun",
    "share_begun",
    "share_done",
    "claim_begun",
    "claim_done",
    "torch_done",
    "accel_begun",
    "accel_done",
    "to_begun",
    "cap_context_done",
    "cap_fraction_begun",
    "cap_done",
    "cuda_ready",
    "to_done",
    "loader_iter_done",
    "first_batch",
    "first_step",
)


def timeline(jobs: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Per point of the probe's timeline: [median seconds since the job's launch, median CPU
    seconds of the process by then] over the jobs that reached it."""
    out: dict[str, list[float]] = {}
    for name in TIMELINE:
        points = [
            (j["probe"]["timeline"][name], j["launched"])
            for j in jobs
            if name in ((j.get("probe") or {}).get("timeline") or {})
        ]
        if points:
            out[name] = [
                round(statistics.median(at - launched for (at, _), launched in points), 2),
                round(statistics.median(cpu for (_, cpu), _ in points), 2),
            ]
    return out


BASELINES = ("hand_mps", "hand_mps_cap")
"""The hand-tuned conditions a report compares with: uncapped, and capped at the claim (the same
memory safety as memgov's, as an expert keeping jobs apart would set it)."""


def ratios(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per kind and round: a hand-tuned condition's span / each other condition's span (>= 1: as
    fast or faster than hand-tuned), and the median over rounds; beside it where the difference
    is: each condition's median steady rate over hand's (>= 1: trains as fast), and its median
    start-up, after-training and CPU seconds minus hand's (<= 0: no slower, no costlier); and
    all rounds' spans summed, hand's over the other's (``x_hand_span_summed``). Keys
    "kind:condition" against hand_mps, "kind:condition/hand_mps_cap" against the capped one
    (memgov's conditions and the capped one's variants, hand_mps_cap_*, only)."""
    out: dict[str, Any] = {}
    for kind in sorted({r["kind"] for r in runs}):
        mine = [r for r in runs if r["kind"] == kind]
        for base in BASELINES:
            hands = {r["round"]: r for r in mine if r["condition"] == base}
            others = sorted({r["condition"] for r in mine} - {base})
            if base != "hand_mps":
                others = [c for c in others if c.startswith(("memgov", f"{base}_"))]
            for cond in others:
                pairs = [
                    (hands[r["round"]], r)
                    for r in mine
                    if r["condition"] == cond and r["round"] in hands and r["span_s"] > 0
                ]
                each = [round(h["span_s"] / t["span_s"], 3) for h, t in pairs]
                if not each:
                    continue
                found: dict[str, Any] = {
                    "x_hand_span_each_round": each,
                    "median": round(statistics.median(each), 3),
                    # Every round's spans summed on each side: a round the machine slowed for
                    # both counts as much as any other, whichever condition came first in it.
                    "x_hand_span_summed": round(
                        sum(h["span_s"] for h, _ in pairs) / sum(t["span_s"] for _, t in pairs), 3
                    ),
                }
                found.update(_where_ratios(pairs))
                key = f"{kind}:{cond}" if base == "hand_mps" else f"{kind}:{cond}/{base}"
                out[key] = found
    return out


def _where_ratios(pairs: list[tuple[dict[str, Any], dict[str, Any]]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    hw = [(h["where"], t["where"]) for h, t in pairs]
    rates = [
        round(t["rate_median"] / h["rate_median"], 3)
        for h, t in hw
        if h.get("rate_median") and t.get("rate_median")
    ]
    if rates:
        out["x_hand_rate_each_round"] = rates
    for key in ("start_s", "after_s", "exit_s", "cpu_s", "gc_full_cpu_s"):
        deltas = [
            round(t[f"{key}_median"] - h[f"{key}_median"], 3)
            for h, t in hw
            if f"{key}_median" in h and f"{key}_median" in t
        ]
        if deltas:
            out[f"{key}_minus_hand_each_round"] = deltas
    return out


GUESS_S = 60.0
"""A kind's expected run before its first one (25 jobs took 33-60 s on the H200, daemons
started and stopped in a few seconds)."""


def _terminate(signum: int, _frame: object) -> None:
    raise SystemExit(f"signal {signum}: ending early, the report is written")


def write_report(report: dict[str, Any], args: argparse.Namespace) -> None:
    """The report so far (rewritten after every run: a call cut short keeps what it measured)."""
    report["ratios"] = ratios(report["runs"])
    (args.out / f"scripts_{args.tag}.json").write_text(json.dumps(report, indent=1))


def progress_line(r: dict[str, Any]) -> str:
    w = r["where"]
    return (
        f"{r['kind']:7} {r['condition']:17} round {r['round']}: ok {r['ok']}/{r['n']} span "
        f"{r['span_s']} s; medians: start {w.get('start_s_median')} s, rate "
        f"{w.get('rate_median')}/s, after {w.get('after_s_median')} s, exit "
        f"{w.get('exit_s_median')} s, cpu {w.get('cpu_s_median')} s; alloc retries "
        f"{w['num_alloc_retries']}, threads {w['threads_seen']}; device peak "
        f"{r['device_peak_mib']} MiB, suspect lines {len(r['suspect_lines'])}"
    )


def startup_samples(runs: list[dict[str, Any]], top: int = 12) -> list[str]:
    """The probe's start-up samples (--startup-samples), per condition: the main thread's CPU
    seconds until the first step, per job (the mean over every job of every run), by the
    script's line and by innermost frame, the frames where the conditions differ most first;
    memgov's own frames; the collector's collections and CPU."""
    tables: dict[str, dict[str, dict[str, float]]] = {}
    jobs: dict[str, int] = {}
    collector: dict[str, list[tuple[float, int]]] = {}
    for r in runs:
        for job in r["jobs"]:
            got = (job.get("probe") or {}).get("startup_samples")
            if not got:
                continue
            cond = r["condition"]
            jobs[cond] = jobs.get(cond, 0) + 1
            for table in ("by_script_line", "by_inner_frame", "in_memgov"):
                mine = tables.setdefault(cond, {}).setdefault(table, {})
                for key, seconds in got[table].items():
                    mine[key] = mine.get(key, 0.0) + seconds
            collector.setdefault(cond, []).append((got["gc"]["cpu_s"], got["gc"]["full"]))
    if not jobs:
        return []
    conds = sorted(jobs)
    lines = [f"start-up samples, main-thread CPU s per job until its first step ({jobs}):"]
    for cond in conds:
        lines.append(
            f"  {cond}: the collector {statistics.mean(c for c, _ in collector[cond]):.3f} s "
            f"a job ({statistics.median(f for _, f in collector[cond]):g} full collections), "
            f"memgov's frames {sum(tables[cond]['in_memgov'].values()) / jobs[cond]:.3f} s"
        )
    for table in ("by_script_line", "by_inner_frame"):
        keys = {k for cond in conds for k in tables[cond][table]}

        def per_job(cond: str, key: str, table: str = table) -> float:
            return tables[cond][table].get(key, 0.0) / jobs[cond]

        spread = sorted(
            keys,
            key=lambda k: -(max(per_job(c, k) for c in conds) - min(per_job(c, k) for c in conds)),
        )
        lines.append(f"  {table} ({' / '.join(conds)}), where they differ most:")
        lines += [
            f"    {key}: " + " / ".join(f"{per_job(c, key):.3f}" for c in conds)
            for key in spread[:top]
        ]
    for cond in conds:
        ours = sorted(tables[cond]["in_memgov"].items(), key=lambda kv: -kv[1])[:top]
        if ours:
            lines.append(
                f"  memgov's frames in {cond}: "
                + ", ".join(f"{k} {v / jobs[cond]:.4f}" for k, v in ours)
            )
    return lines


def summary(report: dict[str, Any]) -> list[str]:
    """One line a run: span, start-up, CPU per job and where it went (medians over the jobs),
    then the ratios against hand-tuned."""
    lines = []
    if report.get("warmup"):
        lines.append(f"warm-up, not compared: {json.dumps(report['warmup'])}")
    lines.append(
        "kind condition round ok span_s start_s cpu_s | main_thread_s children_s "
        "memgov_threads_s tasks_at_exit"
    )
    for r in report["runs"]:
        w = r["where"]
        py = w.get("python_threads_cpu_s") or {}
        mine = round(sum(v for k, v in py.items() if k.startswith("memgov")), 2)
        lines.append(
            f"{r['kind']} {r['condition']} {r['round']} {r['ok']}/{r['n']} {r['span_s']} "
            f"{w.get('start_s_median')} {w.get('cpu_s_median')} | {py.get('MainThread')} "
            f"{w.get('children_cpu_s_median')} {mine} {w.get('tasks_median')}"
        )
    lines.append(
        "start-up timeline, medians over the jobs: point seconds_since_launch/process_cpu_s"
    )
    for r in report["runs"]:
        points = r["where"].get("timeline") or {}
        if points:
            shown = " ".join(f"{name} {at}/{cpu}" for name, (at, cpu) in points.items())
            lines.append(f"  {r['kind']} {r['condition']} {r['round']}: {shown}")
    # The machine drifts within a call: each run in launch order, span / CPU seconds per job.
    by_launch = sorted(
        report["runs"], key=lambda r: min((j["launched"] for j in r["jobs"]), default=0)
    )
    lines.append(
        "in launch order (span_s/cpu_s per job): "
        + " | ".join(
            f"{r['kind']}:{r['condition']} {r['span_s']:.1f}/{r['where'].get('cpu_s_median')}"
            for r in by_launch
        )
    )
    mixed = [r for r in report["runs"] if r.get("groups")]
    if mixed:
        lines.append(
            "mixed runs, per half (medians over its jobs): half n ok last_exit_s wall_s start_s "
            "rate after_s cpu_s children_cpu_s"
        )
    for r in mixed:
        for name, g in r["groups"].items():
            lines.append(
                f"  {r['kind']} round {r['round']} {name} {g['n']} {g['ok']} {g['last_exit_s']} "
                f"{g['wall_s_median']} {g.get('start_s_median')} {g.get('rate_median')} "
                f"{g.get('after_s_median')} {g.get('cpu_s_median')} "
                f"{g.get('children_cpu_s_median')}"
            )
    if mixed:
        lines.append("mixed runs' start-up timeline, per half (point seconds/process_cpu_s):")
    for r in mixed:
        for name, g in r["groups"].items():
            points = g.get("timeline") or {}
            stamps = " ".join(f"{p} {at}/{cpu}" for p, (at, cpu) in points.items())
            lines.append(f"  {r['kind']} round {r['round']} {name}: {stamps}")
    lines += startup_samples(report["runs"])
    lines.append("hand-tuned span / condition span, each round (hand_mps, or the one named):")
    # From the runs, not the report's own ratios: a report older than a baseline lacks them.
    lines += [
        f"  {k}: {v['x_hand_span_each_round']}, all rounds summed {v['x_hand_span_summed']}"
        for k, v in ratios(report["runs"]).items()
    ]
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--summarize",
        type=Path,
        nargs="+",
        help="print reports' summaries (.json or .json.gz), run none",
    )
    p.add_argument(
        "--examples",
        type=Path,
        default=ROOT / ".public" / "examples",
        help="a checkout (or copy) of github.com/pytorch/examples",
    )
    p.add_argument(
        "--mnist",
        type=Path,
        # The same public MNIST arrays the bundled experiment trains on (in the tree already:
        # nothing more to carry to the GPU machine).
        default=ROOT / "experiments" / "mnist" / "data" / "mnist.npz",
    )
    p.add_argument("--kinds", default="mnist,dcgan,vae")
    p.add_argument("--conditions", default="hand_mps,memgov_mps")
    p.add_argument("--n", type=int, default=25)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--job-timeout", type=float, default=150.0)
    p.add_argument(
        "--budget",
        type=float,
        default=540.0,
        help="seconds for the whole call: a kind's round is skipped (both conditions) when its "
        "runs, as long as its longest so far, would end past it",
    )
    p.add_argument(
        "--warmup",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="first one run of the first kind and condition, not compared (the first run of a "
        "call met a cold page cache: 46.5 s against 38.6-39.9 s for the four runs after it, "
        "results/h200/2026-11-25-scripts-diag-mnist.json.gz)",
    )
    p.add_argument(
        "--startup-samples",
        type=float,
        metavar="MS",
        help="in every job, put the main thread's CPU until its first step on the Python frames "
        "it is in, looked at every MS milliseconds (the probe's startup_samples)",
    )
    p.add_argument("--tag", default="public")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out")))
    args = p.parse_args()
    if args.startup_samples is not None and not args.startup_samples > 0:
        p.error(f"--startup-samples {args.startup_samples:g}: accepted milliseconds above 0")
    if args.summarize:
        for path in args.summarize:
            print(f"== {path.name}")
            text = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_text()
            print("\n".join(summary(json.loads(text))))
        return 0
    # A time limit's SIGTERM ends the call through the finally below: the report is written.
    signal.signal(signal.SIGTERM, _terminate)
    kinds = [k for k in args.kinds.split(",") if k]
    conds = [c for c in args.conditions.split(",") if c]
    for k in kinds:
        if k not in KINDS:
            p.error(f"--kinds: {k!r}; accepted {', '.join(KINDS)}")
    for c in conds:
        condition(c, "1GiB", 2**40)  # refuses an unknown name before anything starts
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="memgov-scripts-"))
    write_mnist_raw(args.mnist, work / "data")
    import pynvml

    pynvml.nvmlInit()
    total = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).total
    report: dict[str, Any] = {"argv": sys.argv, "machine": tc.machine(), "runs": []}
    hand_daemon: dict[str, Any] = {}
    t0 = time.monotonic()
    spent: dict[str, float] = {}
    try:
        if args.warmup:  # a cold page cache and GPU slow whichever run comes first
            r = run(kinds[0], conds[0], args, work, hand_daemon, total)
            report["warmup"] = {k: r[k] for k in ("kind", "condition", "ok", "n", "span_s")}
            spent[kinds[0]] = time.monotonic() - t0
            print("warm-up, not compared:", progress_line({**r, "round": 0}), flush=True)
        for round_ in range(1, args.rounds + 1):
            for kind in kinds:
                order = conds if round_ % 2 else conds[::-1]
                # A kind's conditions of one round run back to back or not at all (one side
                # alone compares nothing); each is expected to take as long as its kind's
                # longest run so far took, daemons' start and stop included.
                need = len(order) * spent.get(kind, GUESS_S)
                if time.monotonic() - t0 + need > args.budget:
                    report.setdefault("skipped", []).extend(f"{kind}:{c}@{round_}" for c in order)
                    continue
                for cond in order:
                    began = time.monotonic()
                    r = run(kind, cond, args, work, hand_daemon, total)
                    r["round"] = round_
                    report["runs"].append(r)
                    spent[kind] = max(spent.get(kind, 0.0), time.monotonic() - began)
                    print(progress_line(r), flush=True)
                    write_report(report, args)
    finally:
        _kill_live()
        tc.stop_hand_mps(hand_daemon)
        tc.stop_memgov_mps(tc.base_env(work, False))
        write_report(report, args)
        print(json.dumps(report["ratios"], indent=1))
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
