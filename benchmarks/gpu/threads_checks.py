"""Every governed process gets its share of the CPU: the GPU checks (25 plain scripts, pack).

Runs long enough that training, not start-up, dominates (JAX: 25 processes compiling at once
on 16 cores took 28-39 s before their first epoch ended, then ~1 s per 400 steps; runs of 8 x 400
steps compared start-up costs). Each condition takes about 1.5 minutes on an H200 host, so the
conditions are split over calls with --only, each keeping the pairs it compares:
    python3 benchmarks/gpu/threads_checks.py jax --only memgov_mps,hand_mps,memgov,hand --out "$OUT"
    python3 benchmarks/gpu/threads_checks.py jax \
        --only hand_mps,pack,memgov_mps_stagger,hand_mps_stagger --out "$OUT"
    python3 benchmarks/gpu/threads_checks.py torch --only hand_mps,pack --out "$OUT"
    python3 benchmarks/gpu/threads_checks.py jax --cpu --n 3 --out /tmp/x   (script check, CPU)

25 copies of a plain script (benchmarks/workloads/plain_<framework>_mnist.py: never imports
memgov, sets no threads) per condition, all in this one call:
  1a memgov_mps : MEMGOV_CLAIM=1GiB only, while a daemon started by `memgov mps start` runs
     hand_mps   : OMP_NUM_THREADS=1, no memgov, under an MPS daemon started by hand (private pipe
                  and log folders)
  1b memgov     : MEMGOV_CLAIM=1GiB only, no MPS anywhere
     hand       : OMP_NUM_THREADS=1 only, no MPS
  2  *_stagger  : the same as 1a, one job every --stagger seconds (rate over the whole span)
  3  pack       : `memgov pack --n 25` of experiments/mnist, vs hand_mps of this same call
Optional (--extra): memgov_once_stagger (MEMGOV_THREADS=once: the share computed at start, not
followed) to compare the two thread designs under staggered arrivals.
JAX's hand-tuned runs also set XLA_PYTHON_CLIENT_PREALLOCATE=false (without it 25 jobs do not
fit: each preallocates 75 % of the card).

Rates, on pack's bases (memgov/pack/stats.py) so pack and the plain scripts compare: "all ran" =
samples/s from the latest first-epoch start to the earliest last-epoch end; "span" = all samples
/ (last epoch end - first epoch start). Also "all ran steady" (the same window over the epochs
after each job's first, which hold CUDA/cuDNN set-up and, in the plain JAX script, XLA
compilation) and "launch span" (all samples / (last epoch end - first launch): start-up
included; for pack from its warm-up job's launch). pack's rates are computed here from its
report's epoch spans, on the same code as the plain scripts'. A window that never opened (no
moment when every job was in it) is null with a note saying so.
Raw per-job JSON and a summary go to OUT/threads_<fw>[_<tag>].json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))  # nvml.py, bench.py
from _threads_rates import aggregate, line, pack_rates, summary
from bench import kill_groups, variant
from nvml import LoadSampler

ROOT = Path(__file__).resolve().parents[2]
WORKLOADS = ROOT / "benchmarks" / "workloads"
SCRUB = (
    "MEMGOV_",
    "CUDA_MPS_",
    "OMP_",
    "MKL_",
    "OPENBLAS_",
    "XLA_",
    "TF_",
    "JAX_PLATFORMS",
    "NUMEXPR_",
    "VECLIB_",
)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("framework", choices=("torch", "jax"))
    p.add_argument("--out", default=os.environ.get("OUT", "out"))
    p.add_argument("--n", type=int, default=25)
    p.add_argument("--epochs", type=int, default=None)
    p.add_argument("--steps", type=int, default=None, help="steps per epoch")
    p.add_argument("--stagger", type=float, default=2.0)
    p.add_argument("--only", default="", help="comma-separated conditions to run")
    p.add_argument("--extra", action="store_true", help="also the MEMGOV_THREADS=once variant")
    p.add_argument(
        "--cpu",
        action="store_true",
        help="check the script on a CPU machine: jobs on CPU, simulated GPU, no MPS",
    )
    p.add_argument(
        "--variant",
        action="append",
        type=variant,
        default=[],
        metavar="NAME=ARGS",
        help="also conditions pack_NAME and trainer_mps_NAME: pack, and its trainer by hand, "
        "with these trainer arguments (e.g. 'torchopt=--no-flat-optimizer'); pick them with "
        "--only like the others",
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run the selected conditions this many times, in turn (round k>1 is NAME@k); "
        "each round's ratios compare runs of that round, and their median is reported",
    )
    p.add_argument("--job-timeout", type=float, default=170.0)
    p.add_argument("--tag", default="", help="added to the output file's name")
    p.add_argument("--budget", type=float, default=530.0, help="seconds for the whole call")
    args = p.parse_args()
    if args.repeat < 1:
        p.error(f"--repeat {args.repeat}: accepted a whole number >= 1")
    fw = args.framework
    # Sized on the H200 figures of 2026-11-23 (25 jobs under MPS): torch ~1.7 s and JAX ~1 s
    # per 400-500 steps once started, so ~30-40 s of training after 10-40 s of start-up.
    epochs = args.epochs or (20 if fw == "torch" else 10)
    steps = args.steps or (500 if fw == "torch" else 1280)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="memgov-threads-"))
    t_call = time.monotonic()
    report: dict[str, Any] = {
        "framework": fw,
        "argv": sys.argv,
        "n": args.n,
        "epochs": epochs,
        "steps": steps,
        "machine": machine(),
        "conditions": {},
    }
    hand_daemon: dict[str, Any] = {}
    stopper = _Stopper()
    try:
        base = base_env(work, args.cpu)
        prepare_data(base)
        conds = conditions(fw, args, base, work)
        wanted = [c for c in args.only.split(",") if c]
        selected = [
            (name, cond)
            for name, cond in conds.items()
            if (not wanted or name in wanted)
            and not (cond.get("extra") and not args.extra and name not in wanted)
        ]
        for round_ in range(1, args.repeat + 1):
            for base_name, cond in selected:
                name = base_name if round_ == 1 else f"{base_name}@{round_}"
                left = args.budget - (time.monotonic() - t_call)
                if left < 40:
                    report["conditions"][name] = {"skipped": f"{left:.0f} s of the budget left"}
                    continue
                if cond.get("mps") and args.cpu:
                    cond["mps"] = None  # the script's own check: the same runs, without MPS
                    cond["what"] += " (--cpu: run without MPS)"
                print(f"=== {name}: {cond['what']}", flush=True)
                sampler = LoadSampler(gpu_index=None if args.cpu else 0)
                with sampler:
                    result = run_one(
                        name, cond, fw, args, base, work, hand_daemon, left, epochs, steps
                    )
                # CPU and GPU load while every job trained, and over the whole condition.
                opened = result.get("all_ran_from") is not None
                result["load_all_ran"] = (
                    sampler.means(result["all_ran_from"], result["all_ran_to"]) if opened else None
                )
                result["load"] = sampler.means()
                report["conditions"][name] = result
                print(line(name, result), flush=True)
                stopper.check()
    finally:
        stop_hand_mps(hand_daemon)
        stop_memgov_mps(base_env(work, args.cpu))
        report["summary"] = summary(report["conditions"])
        tag = f"_{args.tag}" if args.tag else ""
        dest = out / f"threads_{fw}{'_cpu' if args.cpu else ''}{tag}.json"
        dest.write_text(json.dumps(report, indent=1, default=str))
        shutil.rmtree(work, ignore_errors=True)
    print("\n== summary (" + dest.name + ")")
    print(
        f"{'condition':22} {'ok':>6} {'all ran /s':>12} {'span /s':>12} {'steady /s':>12} "
        f"{'launch /s':>12} {'epoch s':>8}  threads"
    )
    for name, r in report["conditions"].items():
        if "skipped" in r:
            print(f"{name:22} skipped: {r['skipped']}")
            continue
        print(
            f"{name:22} {str(r.get('ok')) + '/' + str(r.get('n')):>6} "
            f"{r.get('samples_per_s_all_ran')!s:>12} {r.get('samples_per_s_span')!s:>12} "
            f"{r.get('samples_per_s_all_ran_steady')!s:>12} "
            f"{r.get('samples_per_s_launch_span')!s:>12} "
            f"{r.get('steady_epoch_s_median')!s:>8}  {r.get('framework_threads_seen')}"
        )
    for key, value in report["summary"].items():
        if isinstance(value, dict) and "goal" in value:
            print(
                f"{key:28} all ran x{value['all_ran']}  span x{value['span']}  steady "
                f"x{value['all_ran_steady']}  launch span x{value['launch_span']}  "
                f"({value['goal']})"
            )
    return 0


def run_one(
    name: str,
    cond: dict[str, Any],
    fw: str,
    args: argparse.Namespace,
    base: dict[str, str],
    work: Path,
    hand_daemon: dict[str, Any],
    left: float,
    epochs: int,
    steps: int,
) -> dict[str, Any]:
    if "pack_args" in cond:
        limit = min(left - 10, 200)
        return run_pack(fw, args, base, work / name, limit, epochs, steps, cond["pack_args"])
    with mps_for(cond, base, work, hand_daemon):
        limit = min(args.job_timeout, left - 10)
        return run_condition(name, fw, cond, args, work, epochs, steps, limit)


class _Stopper:
    """SIGTERM/SIGINT end the run through the finally blocks (MPS daemons always stopped)."""

    def __init__(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._raise)

    @staticmethod
    def _raise(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    def check(self) -> None:
        pass


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {"nproc": len(os.sched_getaffinity(0)), "python": sys.version}
    with contextlib.suppress(Exception):
        info["gpu"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout.strip()
    info["mps_control"] = shutil.which("nvidia-cuda-mps-control")
    return info


def base_env(work: Path, cpu: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(SCRUB)}
    env.update(
        PYTHONUNBUFFERED="1",
        MEMGOV_DATA_CACHE=str(work / "data-cache"),
        MEMGOV_DIR=str(work / "ledger"),
    )
    if cpu:
        env["MEMGOV_DEVICES"] = "sim0:16GiB"
    return env


def prepare_data(env: dict[str, str]) -> None:
    """Extract the MNIST arrays once, so 25 jobs do not all do it at the same time."""
    code = (
        "import sys; sys.path.insert(0, 'experiments/mnist'); import mnist_data; mnist_data.load()"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True)


def conditions(
    fw: str, args: argparse.Namespace, base: dict[str, str], work: Path
) -> dict[str, dict[str, Any]]:
    hand = {"OMP_NUM_THREADS": "1"}
    if fw == "jax":
        hand["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    memgov = {"MEMGOV_CLAIM": "1GiB"}
    # Order: must-show 1a and 3 first (3 compares with hand_mps of the same call), then 1b, 2.
    return {
        "memgov_mps": {
            "what": "MEMGOV_CLAIM=1GiB, `memgov mps start` daemon",
            "env": memgov,
            "mps": "memgov",
        },
        "hand_mps": {"what": f"{hand}, MPS daemon started by hand", "env": hand, "mps": "hand"},
        "pack": {"what": f"memgov pack --n {args.n} --framework {fw} (MPS auto)", "pack_args": []},
        **{
            f"pack_{name}": {
                "what": f"memgov pack --n {args.n} --framework {fw} -- {flags}",
                "pack_args": shlex.split(flags),
            }
            for name, flags in args.variant
        },
        "trainer_mps": {
            "what": f"pack's trainer (experiments/mnist) started by hand: {hand}, no memgov, "
            "MPS daemon started by hand",
            "env": hand,
            "mps": "hand",
            "trainer": [],
        },
        **{
            f"trainer_mps_{name}": {
                "what": f"as trainer_mps, with trainer arguments {flags}",
                "env": hand,
                "mps": "hand",
                "trainer": shlex.split(flags),
            }
            for name, flags in args.variant
        },
        "memgov": {"what": "MEMGOV_CLAIM=1GiB, no MPS", "env": memgov},
        "hand": {"what": f"{hand}, no MPS", "env": hand},
        "memgov_mps_stagger": {
            "what": f"as memgov_mps, one job every {args.stagger:g} s",
            "env": memgov,
            "mps": "memgov",
            "stagger": args.stagger,
        },
        "hand_mps_stagger": {
            "what": f"as hand_mps, one job every {args.stagger:g} s",
            "env": hand,
            "mps": "hand",
            "stagger": args.stagger,
        },
        "memgov_once_stagger": {
            "what": "as memgov_mps_stagger with MEMGOV_THREADS=once",
            "env": {**memgov, "MEMGOV_THREADS": "once"},
            "mps": "memgov",
            "stagger": args.stagger,
            "extra": True,
        },
    }


# -- MPS ----------------------------------------------------------------------------------------
@contextlib.contextmanager
def mps_for(cond: dict[str, Any], base: dict[str, str], work: Path, hand: dict[str, Any]):
    """The condition's MPS daemon: memgov's (`memgov mps start`), one started by hand, or none.
    Every daemon is stopped before the next condition, also on errors and signals."""
    kind = cond.get("mps")
    env = dict(base)
    if kind == "memgov":
        r = subprocess.run(
            [sys.executable, "-m", "memgov", "mps", "start", "--json"],
            cwd=ROOT,
            env=base,
            capture_output=True,
            text=True,
            timeout=60,
        )
        cond["mps_start"] = {"rc": r.returncode, "out": r.stdout[-2000:], "err": r.stderr[-2000:]}
        try:
            yield env
        finally:
            stop_memgov_mps(base)
    elif kind == "hand":
        pipe, log = work / "hand-mps" / "pipe", work / "hand-mps" / "log"
        pipe.mkdir(parents=True, exist_ok=True)
        log.mkdir(parents=True, exist_ok=True)
        denv = {**base, "CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_MPS_LOG_DIRECTORY": str(log)}
        r = subprocess.run(
            ["nvidia-cuda-mps-control", "-d"], env=denv, capture_output=True, text=True, timeout=30
        )
        hand.update(env=denv, started=r.returncode == 0)
        cond["mps_start"] = {"rc": r.returncode, "err": r.stderr[-2000:]}
        cond["env_extra"] = {
            "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
            "CUDA_MPS_LOG_DIRECTORY": str(log),
        }
        try:
            yield denv
        finally:
            stop_hand_mps(hand)
    else:
        yield env


def stop_hand_mps(hand: dict[str, Any]) -> None:
    if not hand.get("started"):
        return
    with contextlib.suppress(Exception):
        subprocess.run(
            ["nvidia-cuda-mps-control"],
            input="quit\n",
            env=hand["env"],
            text=True,
            capture_output=True,
            timeout=30,
        )
    hand["started"] = False
    time.sleep(1.0)


def stop_memgov_mps(base: dict[str, str]) -> None:
    with contextlib.suppress(Exception):
        subprocess.run(
            [sys.executable, "-m", "memgov", "mps", "stop", "--force", "--json"],
            cwd=ROOT,
            env=base,
            capture_output=True,
            text=True,
            timeout=60,
        )


# -- one condition ------------------------------------------------------------------------------
def _stamp_reports(proc: subprocess.Popen[bytes], path: Path) -> None:
    """A trainer's JSON-lines reports, stamped on arrival as pack stamps them, into the plain
    scripts' per-job JSON (epochs with t0/t1), rewritten after each epoch."""
    doc: dict[str, Any] = {"epochs": [], "ok": False, "memgov_imported": None}
    assert proc.stdout is not None
    for raw in proc.stdout:
        now = time.time()
        # A line that is not one of the trainer's report objects is skipped, never fatal (a
        # dead reader would leave the job blocked on a full pipe).
        with contextlib.suppress(ValueError, AttributeError, KeyError, TypeError):
            event = json.loads(raw)
            if event.get("event") == "epoch":
                doc["epochs"].append(
                    {
                        "epoch": event["epoch"] - 1,
                        "samples": event["samples"],
                        "t0": now - event["seconds"],
                        "t1": now,
                        "seconds": event["seconds"],
                    }
                )
            elif event.get("event") == "start":
                doc["start"] = event
            elif event.get("event") == "done":
                doc["ok"] = True
            path.write_text(json.dumps(doc))
    path.write_text(json.dumps(doc))


def run_condition(
    name: str,
    fw: str,
    cond: dict[str, Any],
    args: argparse.Namespace,
    work: Path,
    epochs: int,
    steps: int,
    limit: float,
) -> dict[str, Any]:
    folder = work / name
    folder.mkdir(parents=True, exist_ok=True)
    env = {**base_env(work, args.cpu), **cond["env"], **cond.get("env_extra", {})}
    device = "cpu" if args.cpu else "gpu"
    trainer = "trainer" in cond
    procs: list[tuple[subprocess.Popen[bytes], Path, float]] = []
    readers: list[threading.Thread] = []
    launch = time.time()
    t_end = time.monotonic() + limit
    try:
        for i in range(args.n):
            if i and cond.get("stagger"):
                time.sleep(cond["stagger"])
            path = folder / f"job{i:02d}.json"
            common = ["--epochs", str(epochs), "--device", device]
            if trainer:  # pack's job, as pack starts it, with pack's data size and evaluation
                cmd = [
                    sys.executable,
                    f"train_{fw}.py",
                    *common,
                    "--limit",
                    str(steps * 32),
                    "--eval-limit",
                    "500",
                    *cond["trainer"],
                ]
                cwd = ROOT / "experiments" / "mnist"
            else:
                cmd = [
                    sys.executable,
                    str(WORKLOADS / f"plain_{fw}_mnist.py"),
                    *common,
                    "--steps",
                    str(steps),
                    "--out",
                    str(path),
                ]
                cwd = ROOT
            with open(folder / f"job{i:02d}.log", "wb") as log:
                proc = subprocess.Popen(
                    cmd,
                    cwd=cwd,
                    env=env,
                    stdout=subprocess.PIPE if trainer else log,
                    stderr=log if trainer else subprocess.STDOUT,
                    start_new_session=True,
                )
            if trainer:
                reader = threading.Thread(target=_stamp_reports, args=(proc, path), daemon=True)
                reader.start()
                readers.append(reader)
            procs.append((proc, path, time.time()))
        for proc, _, _ in procs:
            try:
                proc.wait(timeout=max(1.0, t_end - time.monotonic()))
            except subprocess.TimeoutExpired:
                break
    finally:
        kill_groups((proc for proc, _, _ in procs), readers)
    jobs = []
    for i, (proc, path, started) in enumerate(procs):
        doc: dict[str, Any] = {}
        with contextlib.suppress(OSError, ValueError):
            doc = json.loads(path.read_text())
        log = (folder / f"job{i:02d}.log").read_text(errors="replace")
        jobs.append(
            {
                "index": i,
                "rc": proc.returncode,
                "launched": started,
                "ok": bool(doc.get("ok")) and proc.returncode == 0,
                "memgov_imported": doc.get("memgov_imported"),
                "epochs": doc.get("epochs", []),
                "memgov_lines": [x for x in log.splitlines() if x.startswith("memgov:")][:8],
                "log_tail": log.splitlines()[-5:] if proc.returncode else [],
            }
        )
    return {
        "what": cond["what"],
        "env": cond["env"],
        "mps_start": cond.get("mps_start"),
        **aggregate(jobs, launch),
        "jobs": jobs,
    }


# -- pack ---------------------------------------------------------------------------------------
def run_pack(
    fw: str,
    args: argparse.Namespace,
    base: dict[str, str],
    work: Path,
    limit: float,
    epochs: int,
    steps: int,
    trainer_args: list[str],
) -> dict[str, Any]:
    dest = work  # this condition's own folder (pack makes it)
    limit_images = steps * 32
    cmd = [
        sys.executable,
        "-m",
        "memgov",
        "pack",
        "--n",
        str(args.n),
        "--framework",
        fw,
        "--mode",
        "claim",
        "--epochs",
        str(epochs),
        "--no-solo",
        "--no-progress",
        "--timeout",
        str(int(limit - 15)),
        "--out",
        str(dest),
    ]
    if args.cpu:
        cmd += ["--device", "cpu"]
    cmd += ["experiments/mnist", "--", "--limit", str(limit_images), "--eval-limit", "500"]
    cmd += trainer_args
    t0 = time.time()
    r = subprocess.run(cmd, cwd=ROOT, env=base, capture_output=True, text=True, timeout=limit)
    rep: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        rep = json.loads((dest / "report.json").read_text())
    keep = (
        "ok",
        "n",
        "aggregate_samples_per_s",
        "aggregate_samples_per_s_span",
        "threads_per_job",
        "mps",
        "claim_mib",
        "footprint_mib",
        "wall_s",
    )
    return {
        "what": " ".join(cmd[2:]),
        "rc": r.returncode,
        "wall_s": round(time.time() - t0, 1),
        **pack_rates(rep),
        "pack_reported": {
            "aggregate_samples_per_s": rep.get("aggregate_samples_per_s"),
            "aggregate_samples_per_s_span": rep.get("aggregate_samples_per_s_span"),
        },
        **{k: rep.get(k) for k in keep},
        "stdout_tail": r.stdout.splitlines()[-25:],
        "stderr_tail": r.stderr.splitlines()[-10:],
        "report": rep,
    }


if __name__ == "__main__":
    sys.exit(main())
