"""A user's first day under ``auto`` (docs/profiles.md, "First runs"): N copies of each of two
unchanged public scripts at once, from an empty MEMGOV_DIR, then the same from their profiles.

    python benchmarks/gpu/auto_first_runs.py --examples .public/examples --out OUT [--smoke]

The scripts are the PyTorch examples' ``mnist/main.py`` and ``vae/main.py`` (github.com/pytorch/
examples, carried unchanged in ``.public/examples``: the GPU machine has no network), one epoch
each; MNIST's IDX files are written from the bundled ``experiments/mnist/data/mnist.npz`` into
``../data`` of every job's folder (torchvision's layout). Every job is a plain process with
``MEMGOV_CLAIM=auto``, ``MEMGOV_STRICT=1`` (a claim memgov cannot make fails the job) and
``MEMGOV_WAIT`` (a claim that does not fit yet queues), a client of ``memgov mps start`` (its
daemon in the ledger's private folders, stopped at the end).

Phases, one ledger: ``first`` (no profile: the copies of a job wait for its first run, then are
sized from it) and ``profiles`` (every copy sized from its profile). Per job: exit status, each
claim its record showed (size, where it came from), its NVML peak, whether it ran out of memory,
memgov's lines. Last, ``own_oom``: one governed job (2 GiB) whose own 3 GiB allocation fails, its
profile run (peak, ``asked``) and the label the queue's report gives such an OOM (its own, not a
neighbour's). Raw JSON: OUT/auto_first_runs.json (rewritten after each phase). ``--smoke``: the
same on a CPU machine (simulated GPU, ``--dry-run`` jobs, no MPS): checks this script only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from auto_checks import Job, Watch, write_mnist

ROOT = Path(__file__).resolve().parents[2]
MiB = 2**20
SCRIPTS = {"mnist": "mnist/main.py", "vae": "vae/main.py"}


def jobs_for(args: argparse.Namespace, work: Path, base: dict[str, str], phase: str) -> list[Job]:
    jobs = []
    for kind in args.kinds.split(","):
        for i in range(args.n):
            name = f"{phase}-{kind}-{i:02d}"
            cwd = work / name  # a child of work: the scripts' '../data' is work/data
            (cwd / "results").mkdir(parents=True)  # vae saves images into results/
            argv = [sys.executable, str(args.examples / SCRIPTS[kind]), "--epochs", "1"]
            argv += ["--dry-run"] if args.smoke else []
            env = {**base, "MEMGOV_CLAIM": "auto", "MEMGOV_WAIT": str(args.wait)}
            jobs.append(Job(name, kind, argv, cwd, env))
    return jobs


def run_phase(
    args: argparse.Namespace, work: Path, base: dict[str, str], phase: str
) -> dict[str, Any]:
    jobs = jobs_for(args, work, base, phase)
    mps = None
    if not args.smoke:
        mps = subprocess.run(
            [sys.executable, "-m", "memgov", "mps", "start", "--json"],
            env=base,
            capture_output=True,
            text=True,
            timeout=60,
        )
    start = time.monotonic()
    try:
        with Watch(args.smoke) as watch:
            for job in jobs:  # all at once: no stagger
                job.log = job.cwd / "output.log"
                with open(job.log, "wb") as log:
                    job.proc = subprocess.Popen(
                        job.argv, cwd=job.cwd, env=job.env, stdout=log, stderr=subprocess.STDOUT
                    )
                job.started = time.monotonic()
            deadline = start + args.phase_budget
            for job in jobs:
                assert job.proc is not None
                try:
                    job.proc.wait(timeout=max(1.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    job.proc.kill()
                    job.proc.wait()
                job.ended = time.monotonic()
        span = time.monotonic() - start
    finally:
        if not args.smoke:
            subprocess.run(
                [sys.executable, "-m", "memgov", "mps", "stop"],
                env=base,
                capture_output=True,
                timeout=60,
            )
    rows = []
    for job in jobs:
        assert job.proc is not None
        seen = watch.by_pid.get(job.proc.pid, [])
        job.claims = [b for b, _, _ in seen]
        job.sized = seen[0][1] if seen else None
        job.job = seen[0][2] if seen else None
        rows.append(job.summary(watch.peaks))
    failed = [r["name"] for r in rows if r["rc"] != 0]
    return {
        "phase": phase,
        "jobs": rows,
        "failed": failed,
        "oom": [r["name"] for r in rows if r["oom"]],
        "span_s": round(span, 1),
        "most_claims_at_once": watch.most_claims,
        "claimed_peak_mib": round(watch.claimed_peak / MiB),
        "device_peak_mib": round(watch.device_peak / MiB),
        "mps_start": None if mps is None else {"rc": mps.returncode, "err": mps.stderr[-1000:]},
    }


OWN_OOM = (
    "import torch, memgov\n"
    "assert memgov.current() is not None, 'not governed'\n"
    "if torch.cuda.is_available():\n"
    "    x = torch.empty(3 * 2**30, dtype=torch.uint8, device='cuda')  # past its 2 GiB claim\n"
    "else:\n"
    "    raise MemoryError('a simulated GPU: the smoke run')\n"
)


def own_oom(args: argparse.Namespace, base: dict[str, str]) -> dict[str, Any]:
    """One governed job (MEMGOV_CLAIM=2GiB) whose own allocation (3 GiB) fails: its profile run
    (peak, asked) and the label the queue's report would give it (memgov/queue/report.py)."""
    from memgov.queue import ends, report

    env = {**base, "MEMGOV_CLAIM": "2GiB", "MEMGOV_JOB": "own-oom"}
    done = subprocess.run(
        [sys.executable, "-c", OWN_OOM], env=env, capture_output=True, text=True, timeout=120
    )
    from memgov._profiles import (
        store as _profiles,  # the jobs' store: main() pointed MEMGOV_DIR at their ledger
    )

    profile = _profiles.read("own-oom")
    run = profile.runs[-1] if profile and profile.runs else {}
    peak = ends.peak_of(run)
    claim = run.get("claim") or 0
    neighbour = (
        peak is not None and not run.get("simulated") and peak < (report.NEIGHBOUR_SHARE * claim)
    )
    return {
        "rc": done.returncode,
        "stderr_tail": done.stderr.splitlines()[-3:],
        "run": run,
        "peak_of_mib": None if peak is None else round(peak / MiB),
        "label": "killed by a neighbour" if neighbour else "its own allocation",
    }


def table(phase: dict[str, Any]) -> list[str]:
    out = [
        f"== {phase['phase']}: {len(phase['jobs']) - len(phase['failed'])}/{len(phase['jobs'])} "
        f"exit 0, {len(phase['oom'])} OOM, span {phase['span_s']} s, at most "
        f"{phase['most_claims_at_once']} claims at once, {phase['claimed_peak_mib']:,} MiB "
        f"claimed at most, device peak {phase['device_peak_mib']:,} MiB"
    ]
    for kind in sorted({r["kind"] for r in phase["jobs"]}):
        mine = [r for r in phase["jobs"] if r["kind"] == kind]
        by: dict[str, list[dict[str, Any]]] = {}
        for r in mine:
            by.setdefault(r["sized"] or "none", []).append(r)
        for sized, rs in sorted(by.items()):
            claims = sorted(c for r in rs for c in r["claims_mib"][:1])
            peaks = sorted(r["nvml_peak_mib"] for r in rs if r["nvml_peak_mib"] is not None)
            out.append(
                f"  {kind:6} {sized:10} x{len(rs):<3} claim MiB {claims[:1]}..{claims[-1:]}  "
                f"NVML peak MiB {peaks[:1]}..{peaks[-1:]}  rc {sorted({r['rc'] for r in rs})}"
            )
    for r in phase["jobs"]:
        if r["rc"] != 0:
            out.append(f"  FAILED {r['name']} rc={r['rc']}: {r['tail']}")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--examples", type=Path, default=ROOT / ".public" / "examples")
    p.add_argument("--kinds", default="mnist,vae")
    p.add_argument("--n", type=int, default=25, help="copies of each script")
    p.add_argument("--wait", type=int, default=240, help="MEMGOV_WAIT of every job (seconds)")
    p.add_argument("--phase-budget", type=float, default=200.0, help="seconds per phase")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--smoke", action="store_true")
    args = p.parse_args()
    args.examples = args.examples.resolve()  # each job runs in a folder of its own
    wanted = [SCRIPTS[k] for k in args.kinds.split(",")]
    missing = [s for s in wanted if not (args.examples / s).is_file()]
    if missing:
        raise SystemExit(
            f"{args.examples} lacks {', '.join(missing)}: carry github.com/pytorch/examples "
            "unchanged as .public/examples (benchmarks/gpu/verify.sh, auto_first_runs)"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"command": sys.argv, "n": args.n, "kinds": args.kinds, "phases": []}
    with tempfile.TemporaryDirectory(prefix="auto-first-") as tmp:
        work = Path(tmp)
        write_mnist(work / "data")
        base = {k: v for k, v in os.environ.items() if not k.startswith("MEMGOV_")}
        base.update(MEMGOV_DIR=str(work / "ledger"), PYTHONUNBUFFERED="1", MEMGOV_STRICT="1")
        if args.smoke:
            base["MEMGOV_DEVICES"] = "sim0:16GiB"
        for name in ("MEMGOV_DIR", "MEMGOV_DEVICES"):  # the watch reads the jobs' ledger
            if name in base:
                os.environ[name] = base[name]
        for phase in ("first", "profiles"):
            report["phases"].append(run_phase(args, work, base, phase))
            (args.out / "auto_first_runs.json").write_text(json.dumps(report, indent=1) + "\n")
            print("\n".join(table(report["phases"][-1])), flush=True)
        report["own_oom"] = own = own_oom(args, base)
        (args.out / "auto_first_runs.json").write_text(json.dumps(report, indent=1) + "\n")
        run = own["run"]
        print(
            f"== own OOM: rc {own['rc']}, end {run.get('end')}, claim {run.get('claim')}, peak "
            f"{run.get('peak')}, asked {run.get('asked')}: labelled {own['label']}",
            flush=True,
        )
    failed = sum(len(ph["failed"]) for ph in report["phases"])
    print(f"auto_first_runs: {failed} failed of {2 * args.n * len(args.kinds.split(','))} jobs")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
