"""Each job kind of the queue benchmark alone on the GPU: its wall time and its peak memory.

The figures size the mixes (kinds.py's ``solo_s`` and ``peak_mib``): the one-at-a-time baseline of
30 jobs must fit one device call, and the big kinds must not all fit on one GPU at once. Kinds
run one after another, each in a fresh folder, never beside another job. Per kind, one JSON line:

  wall_s               launch to exit: interpreter, imports, CUDA start-up and training
  first_output_s       the first line the program printed (start-up done, roughly)
  nvml_peak_mib        NVML's peak for the process (CUDA context included: what profiles record)
  device_peak_mib      NVML's device "used" peak minus what it read idle before the kind started
  torch_peak_*_mib     torch's allocator peaks, read at exit by _peaks.py (the script unchanged)

    python3 benchmarks/queue/size_kinds.py [--kinds a,b] [--examples .public/examples]
        [--budget 170] [--out sizing.jsonl]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "gpu"))
from kinds import KINDS, ROOT  # noqa: E402

MARK = "QUEUE_SIZING_PEAKS"


def run_one(name: str, args: argparse.Namespace, work: Path, timeout: float) -> dict[str, Any]:
    kind = KINDS[name]
    cwd = work / name
    (cwd / "results").mkdir(parents=True)  # vae writes its images there
    extra = kind.tiny_args if args.tiny else kind.args
    cmd = [sys.executable, str(HERE / "_peaks.py"), str(kind.script_path(args.examples)), *extra]
    sampler = None
    idle = 0
    if not args.tiny:
        from _sampler import FootprintSampler

        sampler = FootprintSampler(period_s=0.05)
        sampler._read()
        idle, sampler.device_peak = sampler.device_peak, 0
    started = time.monotonic()
    lines: list[str] = []
    stamps: list[float] = []  # when each line came, seconds since the launch
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    firsts: list[float] = []

    def read() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            if not firsts:
                firsts.append(time.monotonic() - started)
            lines.append(raw.decode(errors="replace").rstrip())
            stamps.append(round(time.monotonic() - started, 2))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    with sampler if sampler is not None else contextlib.nullcontext():
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        wall = time.monotonic() - started
    reader.join(timeout=5)
    first = firsts[0] if firsts else None
    peaks = next(
        (json.loads(x.split(" ", 1)[1]) for x in reversed(lines) if x.startswith(MARK)), {}
    )
    mine = [json.loads(x) for x in lines if x.startswith("{") and x.endswith("}")]
    return {
        "kind": name,
        "big": kind.big,
        "args": list(extra),
        "rc": proc.returncode,
        "wall_s": round(wall, 2),
        "first_output_s": round(first or -1.0, 2),
        "nvml_peak_mib": sampler.peak_mib(proc.pid) if sampler else None,
        "device_peak_mib": round((sampler.device_peak - idle) / 2**20, 1) if sampler else None,
        "device_idle_used_mib": round(idle / 2**20, 1) if sampler else None,
        "torch_peak_allocated_mib": peaks.get("peak_allocated_mib"),
        "torch_peak_reserved_mib": peaks.get("peak_reserved_mib"),
        "program_report": mine[-1] if mine else None,
        "lines": len(lines),
        "head": [f"{t} {x[:100]}" for t, x in zip(stamps[:2], lines[:2], strict=False)],
        "tail": [f"{t} {x[:160]}" for t, x in zip(stamps[-3:], lines[-3:], strict=False)],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kinds", default=",".join(KINDS), help="comma-separated; default: all")
    p.add_argument("--examples", type=Path, default=ROOT / ".public" / "examples")
    p.add_argument(
        "--mnist", type=Path, default=ROOT / "experiments" / "mnist" / "data" / "mnist.npz"
    )
    p.add_argument("--budget", type=float, default=170.0, help="seconds for all kinds")
    p.add_argument("--timeout", type=float, default=45.0, help="seconds for one kind")
    p.add_argument("--tiny", action="store_true", help="the kinds' CPU smoke arguments")
    p.add_argument("--out", type=Path, help="JSON lines here too")
    args = p.parse_args()
    args.examples, args.mnist = args.examples.resolve(), args.mnist.resolve()
    names = [k for k in args.kinds.split(",") if k]
    for name in names:
        if name not in KINDS:
            p.error(f"--kinds: {name!r}; accepted {', '.join(KINDS)}")
    work = Path(tempfile.mkdtemp(prefix="memgov-queue-sizing-"))
    if any(KINDS[n].mnist_data for n in names):
        from scripts_checks import write_mnist_raw

        write_mnist_raw(args.mnist, work / "data")
    t0 = time.monotonic()
    out = args.out.open("w") if args.out else None
    for name in names:
        left = args.budget - (time.monotonic() - t0)
        if left < 10:
            line = json.dumps({"kind": name, "skipped": f"budget {args.budget} s spent"})
        else:
            line = json.dumps(run_one(name, args, work, min(args.timeout, left)))
        print(line, flush=True)
        if out:
            out.write(line + "\n")
            out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
