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
  under the hand-started daemon: soft mode, no MPS memory limit)

Per run: the span from the first launch to the last exit (what a user waits for), every job's
exit status and wall time, NVML peak per job and of the device, and every stderr line that is
not the script's own: memgov's info lines (``memgov: ...``) are counted, anything else memgov
printed (a traceback, "Exception ignored") is listed. The plain loop also reports its epochs, so
its rates use threads_checks' bases. Raw JSON to OUT/scripts_<tag>.json.

    python3 benchmarks/gpu/scripts_checks.py --examples .public/examples \
        --mnist .public/data/mnist.npz --kinds mnist,dcgan,vae --rounds 2 --out "$OUT"
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
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
    "mnist": {
        "script": "mnist/main.py",
        "args": ["--epochs", "1", "--log-interval", "100000"],
        "claim": "1600MiB",
        "data": True,
    },
    # DCGAN on FakeData: two DataLoader workers, two networks, Adam, cudnn.benchmark. Alone it
    # peaks at 3,338 MiB (NVML): cuDNN's benchmark tries algorithms with large workspaces. Under a
    # 1 GiB claim it ran (962 MiB) with slower ones: 0.92x of the uncapped hand-tuned copies.
    "dcgan": {
        "script": "dcgan/main.py",
        "args": ["--dataset", "fake", "--niter", "4", "--accel", "--workers", "2"],
        "claim": "3584MiB",
        "data": False,
    },
    # The VAE example: a DataLoader worker, a test pass, images written with save_image.
    "vae": {
        "script": "vae/main.py",
        "args": ["--epochs", "1", "--log-interval", "100000"],
        "claim": "1GiB",
        "data": True,
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
)


def condition(name: str, claim: str, total: int) -> dict[str, Any]:
    """Environment and MPS daemon of one condition (threads_checks.mps_for starts the daemon)."""
    from memgov._sizes import parse_size

    hand = {"OMP_NUM_THREADS": "1"}
    memgov = {"MEMGOV_CLAIM": claim}
    if name == "hand_mps":
        return {"what": f"{hand}, MPS by hand", "env": hand, "mps": "hand"}
    if name == "hand_mps_cap":
        fraction = parse_size(claim) / total
        env = {**hand, "PYTORCH_ALLOC_CONF": f"per_process_memory_fraction:{fraction:.4f}"}
        return {"what": f"{env}, MPS by hand", "env": env, "mps": "hand"}
    if name == "memgov_mps":
        return {"what": f"{memgov}, `memgov mps start`", "env": memgov, "mps": "memgov"}
    if name == "memgov_mps_fixed":
        env = {**memgov, "MEMGOV_THREADS": "1"}
        return {"what": f"{env}, `memgov mps start`", "env": env, "mps": "memgov"}
    if name == "memgov_mps_big":
        env = {"MEMGOV_CLAIM": f"{(parse_size(claim) + 2**30) // 2**20}MiB"}
        return {"what": f"{env}, `memgov mps start`", "env": env, "mps": "memgov"}
    if name == "memgov_soft":
        return {"what": f"{memgov}, MPS by hand (soft claims)", "env": memgov, "mps": "hand"}
    raise SystemExit(f"--conditions: {name!r}; accepted {', '.join(CONDITIONS)}")


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
    with tc.mps_for(cond, base, work, hand_daemon):
        env = {**base, **cond["env"], **cond.get("env_extra", {})}
        sampler = FootprintSampler()
        procs = []
        readers = []
        firsts: dict[int, float] = {}
        launch = time.time()
        with sampler:
            for i in range(args.n):
                cwd = folder / f"job{i:02d}"
                (cwd / "results").mkdir(parents=True)  # vae writes its images there
                cmd = job_command(kind, args.examples.resolve(), cwd / "report.json")
                started = time.time()
                proc = subprocess.Popen(
                    cmd,
                    cwd=cwd,
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
                reader = threading.Thread(
                    target=_stamp, args=(proc, cwd / "log", started, firsts), daemon=True
                )
                reader.start()
                readers.append(reader)
                procs.append((proc, cwd, None, started))
            deadline = time.monotonic() + args.job_timeout
            ended: dict[int, float] = {}
            while len(ended) < len(procs) and time.monotonic() < deadline:
                for proc, _, _, _ in procs:
                    if proc.pid not in ended and proc.poll() is not None:
                        ended[proc.pid] = time.time()
                time.sleep(0.05)
            for proc, _, _, _ in procs:
                if proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
            for reader in readers:
                reader.join(timeout=10)
    jobs = []
    for proc, cwd, _, started in procs:
        text = (cwd / "log").read_text(errors="replace")
        info, suspect = foreign_lines(text)
        doc: dict[str, Any] = {}
        with contextlib.suppress(OSError, ValueError):
            doc = json.loads((cwd / "report.json").read_text())
        jobs.append(
            {
                "rc": proc.returncode,
                "launched": started,
                "wall_s": round(ended.get(proc.pid, time.time()) - started, 2),
                "first_output_s": round(firsts.get(proc.pid, -1.0), 2),
                "nvml_peak_mib": round(sampler.peaks.get(proc.pid, 0) / 2**20, 1),
                "memgov_info_lines": info,
                "suspect_lines": suspect,
                "tail": text.splitlines()[-4:] if proc.returncode else [],
                "ok": proc.returncode == 0,
                "epochs": doc.get("epochs", []),
                "allocator": doc.get("allocator"),
            }
        )
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
        "first_output_s": sorted(j["first_output_s"] for j in jobs),
        "device_peak_mib": round(sampler.device_peak / 2**20, 1),
        "suspect_lines": sorted({x for j in jobs for x in j["suspect_lines"]})[:10],
        "jobs": jobs,
    }
    if kind["script"] is None:
        result["rates"] = {
            k: v
            for k, v in aggregate(jobs, launch).items()
            if k.startswith(("samples_per_s", "span", "ok", "n"))
        }
    return result


def ratios(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per kind and round: hand_mps span / each other condition's span (>= 1: as fast or
    faster than hand-tuned), and the median over rounds."""
    out: dict[str, Any] = {}
    for kind in sorted({r["kind"] for r in runs}):
        mine = [r for r in runs if r["kind"] == kind]
        hands = [r for r in mine if r["condition"] == "hand_mps"]
        for cond in sorted({r["condition"] for r in mine} - {"hand_mps"}):
            theirs = [r for r in mine if r["condition"] == cond]
            each = [
                round(h["span_s"] / t["span_s"], 3)
                for h, t in zip(hands, theirs, strict=False)
                if t["span_s"] > 0
            ]
            if each:
                out[f"{kind}:{cond}"] = {
                    "x_hand_span_each_round": each,
                    "median": round(statistics.median(each), 3),
                }
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--examples",
        type=Path,
        default=ROOT / ".public" / "examples",
        help="a checkout (or copy) of github.com/pytorch/examples",
    )
    p.add_argument("--mnist", type=Path, default=ROOT / ".public" / "data" / "mnist.npz")
    p.add_argument("--kinds", default="mnist,dcgan,vae")
    p.add_argument("--conditions", default="hand_mps,memgov_mps")
    p.add_argument("--n", type=int, default=25)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--job-timeout", type=float, default=150.0)
    p.add_argument("--budget", type=float, default=540.0, help="seconds for the whole call")
    p.add_argument("--tag", default="public")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out")))
    args = p.parse_args()
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
    try:
        for round_ in range(1, args.rounds + 1):
            for kind in kinds:
                for cond in conds if round_ % 2 else conds[::-1]:
                    if time.monotonic() - t0 > args.budget - 30:
                        report.setdefault("skipped", []).append(f"{kind}:{cond}@{round_}")
                        continue
                    r = run(kind, cond, args, work, hand_daemon, total)
                    r["round"] = round_
                    report["runs"].append(r)
                    print(
                        f"{kind:7} {cond:17} round {round_}: ok {r['ok']}/{r['n']} span "
                        f"{r['span_s']} s, device peak {r['device_peak_mib']} MiB, "
                        f"suspect lines {len(r['suspect_lines'])}",
                        flush=True,
                    )
    finally:
        tc.stop_hand_mps(hand_daemon)
        tc.stop_memgov_mps(tc.base_env(work, False))
        report["ratios"] = ratios(report["runs"])
        (args.out / f"scripts_{args.tag}.json").write_text(json.dumps(report, indent=1))
        print(json.dumps(report["ratios"], indent=1))
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
