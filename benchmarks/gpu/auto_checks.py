"""Claims that size themselves, on a real GPU (docs/profiles.md, "On a GPU"): the two GPU checks.

    python benchmarks/gpu/auto_checks.py --scripts DIR --out OUT/auto_checks.json [--smoke]

DIR holds the PyTorch examples' unchanged ``mnist/main.py`` and ``dcgan/main.py``; the third
workload is a transformers GPT-2 built from its config (``gpt2_from_config.py``, a small driver:
transformers ships no script that runs without a download). memgov prepares nothing inside the
scripts: mnist reads the MNIST IDX files that this driver writes from the bundled
``experiments/mnist/data/mnist.npz`` into ``../data/MNIST/raw`` (torchvision's layout); dcgan
trains on ``--dataset fake``. Nothing is fetched. Every job is a plain process started with
``MEMGOV_CLAIM=auto`` (auto-enable), in a fresh ledger with no profiles.

Phases (each job's claim is read from the ledger while it runs, its NVML peak sampled per PID):
  first   4 governed neighbours (mnist, MEMGOV_CLAIM=2GiB) run; each of the three workloads runs
          once under ``auto`` with no profile: a first run (its claim, give back, peak, exit);
  auto    30 at once, 10 of each, under ``auto``: all finish, no OOM, each claim at least the
          process's NVML peak and at most its job's measured peak + 10 % + 64 MiB;
  hand    the same 30 with one hand-picked size for all three (the smallest whole GiB that holds
          the largest peak measured above), MEMGOV_STRICT=1: how many are admitted at once;
          the device's peak use in both cases;
  beside  a first run (GPT-2 with other arguments: a new job) between 24 governed neighbours
          (12 before it, 12 after it): none of them fails because of it.
``--smoke`` runs the same on a CPU machine (simulated GPU, tiny jobs, 1 of each): it checks this
script, not the GPU.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
GPT2 = ROOT / "benchmarks" / "gpu" / "gpt2_from_config.py"
MNIST_NPZ = ROOT / "experiments" / "mnist" / "data" / "mnist.npz"
MNIST_SHA256 = "06af5dfe73b70e3bc1c36439982b18a8d76803db9b544f6fdf838a37fbb01b64"
MiB, GiB = 2**20, 2**30
KINDS = ("mnist", "dcgan", "gpt2")


@dataclass
class Job:
    name: str
    kind: str
    argv: list[str]
    cwd: Path
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    log: Path | None = None
    started: float = 0.0
    ended: float = 0.0
    claims: list[int] = field(default_factory=list)
    """Distinct claim sizes seen in the ledger for this job's process, in order."""
    sized: str | None = None
    job: str | None = None

    def summary(self, peaks: dict[int, int]) -> dict[str, Any]:
        text = self.log.read_text(errors="replace") if self.log and self.log.exists() else ""
        pid = self.proc.pid if self.proc else None
        lines = [ln for ln in text.splitlines() if ln.startswith("memgov:")]
        return {
            "name": self.name,
            "kind": self.kind,
            "pid": pid,
            "rc": self.proc.returncode if self.proc else None,
            "seconds": round(self.ended - self.started, 1),
            "claims_mib": [round(c / MiB) for c in self.claims],
            "sized": self.sized,
            "job": self.job,
            "nvml_peak_mib": round(peaks[pid] / MiB) if pid in peaks else None,
            "oom": "OutOfMemoryError" in text or "out of memory" in text.lower(),
            "memgov_lines": lines[:20],
            "tail": text.splitlines()[-3:],
            "give_back": [ln for ln in lines if "give back" in ln],
        }


class Watch:
    """Samples the ledger (each claim's size per PID) and NVML (per-PID and device peaks)."""

    def __init__(self, smoke: bool) -> None:
        self.smoke = smoke
        self.peaks: dict[int, int] = {}
        self.device_peak = 0
        self.claimed_peak = 0
        self.most_claims = 0
        self.by_pid: dict[int, list[tuple[int, str, str]]] = {}
        """PID -> the claim sizes its record showed, in order, with where each came from and the
        job (memgov status --json: ``sized``, ``job``)."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._sampler: Any = None
        if not smoke:  # NVML every 50 ms in its own thread (the ledger poll is slower)
            sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))
            from nvml import FootprintSampler

            self._sampler = FootprintSampler()

    def __enter__(self) -> Watch:
        self._thread.start()
        if self._sampler is not None:
            self._sampler.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        if self._sampler is not None:
            self._sampler.__exit__()
            self.peaks, self.device_peak = self._sampler.peaks, self._sampler.device_peak

    def _loop(self) -> None:
        from memgov import _status

        while not self._stop.wait(0.25):
            try:
                devices = _status.status()["devices"]
            except Exception:
                continue
            claims = [c for d in devices for c in d["claims"]]
            self.most_claims = max(self.most_claims, len(claims))
            self.claimed_peak = max(self.claimed_peak, sum(c["bytes"] for c in claims))
            for c in claims:
                seen = self.by_pid.setdefault(c["pid"], [])
                if not seen or seen[-1][0] != c["bytes"]:
                    seen.append((c["bytes"], c.get("sized") or "", c.get("job") or ""))


# -- the workloads ------------------------------------------------------------------------------


def write_mnist(data: Path) -> None:
    """torchvision's MNIST layout (``data/MNIST/raw/*-idx?-ubyte``) from the bundled npz."""
    digest = hashlib.sha256(MNIST_NPZ.read_bytes()).hexdigest()
    if digest != MNIST_SHA256:
        raise SystemExit(f"{MNIST_NPZ}: sha256 {digest}, expected {MNIST_SHA256}")
    raw = data / "MNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    arrays = np.load(MNIST_NPZ)
    for split, prefix in (("train", "train"), ("test", "t10k")):
        images, labels = arrays[f"x_{split}"], arrays[f"y_{split}"]
        header = np.array([0x803, len(images), 28, 28], dtype=">i4").tobytes()
        (raw / f"{prefix}-images-idx3-ubyte").write_bytes(header + images.tobytes())
        header = np.array([0x801, len(labels)], dtype=">i4").tobytes()
        (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(header + labels.tobytes())


class Runner:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args, self.work, self.smoke = args, work, args.smoke
        self.count = 0
        self.base = {k: v for k, v in os.environ.items() if not k.startswith("MEMGOV_")}
        # Strict: a claim memgov cannot make fails the job, never lets it run ungoverned.
        self.base.update(MEMGOV_DIR=str(work / "ledger"), PYTHONUNBUFFERED="1", MEMGOV_STRICT="1")
        if self.smoke:
            self.base["MEMGOV_DEVICES"] = "sim0:16GiB"

    def job(
        self,
        kind: str,
        claim: str = "auto",
        env: dict[str, str] | None = None,
        gpt2_args: list[str] | None = None,
    ) -> Job:
        self.count += 1
        name = f"{kind}-{self.count:03d}"
        cwd = self.work / name  # a child of work: mnist's '../data' is work/data
        cwd.mkdir()
        scripts = Path(self.args.scripts)
        if kind == "mnist":
            argv = [str(scripts / "mnist" / "main.py"), "--epochs", "1"]
            argv += ["--dry-run"] if self.smoke else []
        elif kind == "dcgan":
            argv = [
                str(scripts / "dcgan" / "main.py"),
                "--dataset",
                "fake",
                "--niter",
                "1",
                "--outf",
                str(cwd / "out"),
                "--manualSeed",
                str(self.count),
            ]
            argv += ["--dry-run", "--workers", "0"] if self.smoke else ["--accel"]
        else:
            argv = [
                str(GPT2),
                *(gpt2_args or self.args.gpt2_args.split()),
                "--seed",
                str(self.count),
            ]
            argv += ["--device", "cpu", "--tiny"] if self.smoke else []
        full_env = {**self.base, "MEMGOV_CLAIM": claim, **(env or {})}
        return Job(name, kind, [sys.executable, *argv], cwd, full_env)

    def start(self, jobs: list[Job]) -> None:
        for job in jobs:
            job.log = job.cwd / "output.log"
            with open(job.log, "wb") as log:
                job.proc = subprocess.Popen(
                    job.argv,
                    cwd=job.cwd,
                    env=job.env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            job.started = time.monotonic()

    def wait(self, jobs: list[Job], deadline: float, watch: Watch) -> None:
        for job in jobs:
            assert job.proc is not None
            try:
                job.proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(job.proc.pid, 9)
                job.proc.wait()
            job.ended = job.ended or time.monotonic()
            seen = watch.by_pid.get(job.proc.pid, [])
            job.claims = [b for b, _, _ in seen]
            job.sized = seen[0][1] if seen else None
            job.job = seen[0][2] if seen else None


# -- the phases ---------------------------------------------------------------------------------


def profiles(runner: Runner) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "memgov", "profiles", "--json"],
        env=runner.base,
        capture_output=True,
        text=True,
        timeout=60,
    )
    data: dict[str, Any] = (
        json.loads(done.stdout) if done.returncode == 0 else {"error": done.stderr}
    )
    return data


def wait_admitted(watch: Watch, jobs: list[Job], deadline: float) -> None:
    while time.monotonic() < deadline:
        if all(j.proc and (j.proc.pid in watch.by_pid or j.proc.poll() is not None) for j in jobs):
            return
        time.sleep(0.2)


def phase_first(runner: Runner, budget: float) -> dict[str, Any]:
    neighbours = [
        runner.job("mnist", "2GiB", {"MEMGOV_JOB": "neighbour-mnist"})
        for _ in range(runner.args.neighbours)
    ]
    firsts = [runner.job(kind) for kind in KINDS]
    deadline = time.monotonic() + budget
    with Watch(runner.smoke) as watch:
        runner.start(neighbours)
        wait_admitted(watch, neighbours, deadline)
        runner.start(firsts)
        runner.wait(firsts + neighbours, deadline, watch)
    return {
        "neighbours": [j.summary(watch.peaks) for j in neighbours],
        "first_runs": [j.summary(watch.peaks) for j in firsts],
        "device_peak_mib": round(watch.device_peak / MiB),
        "profiles": profiles(runner),
    }


def phase_auto(runner: Runner, budget: float, per_kind: int) -> dict[str, Any]:
    jobs = [runner.job(kind) for _ in range(per_kind) for kind in KINDS]
    deadline = time.monotonic() + budget
    with Watch(runner.smoke) as watch:
        runner.start(jobs)
        runner.wait(jobs, deadline, watch)
    found = profiles(runner)
    rows = [j.summary(watch.peaks) for j in jobs]
    return {
        "jobs": rows,
        "checks": auto_checks(rows, found, watch.peaks, jobs),
        "device_peak_mib": round(watch.device_peak / MiB),
        "claimed_peak_mib": round(watch.claimed_peak / MiB),
        "most_claims_at_once": watch.most_claims,
        "profiles": found,
    }


def auto_checks(
    rows: list[dict[str, Any]], found: dict[str, Any], nvml: dict[int, int], jobs: list[Job]
) -> dict[str, Any]:
    """Each claim against its job's measured peak (the largest of the job's recorded runs,
    this one included) and against its process's NVML peak sampled here."""
    by_job = {p["job"]: p for p in found.get("profiles", [])}
    per_job: list[dict[str, Any]] = []
    for row, job in zip(rows, jobs, strict=True):
        claim = job.claims[0] if job.claims else None
        profile = by_job.get(job.job or "")
        peak = nvml.get(row["pid"] or -1)
        job_peak = profile["peak"] if profile else None
        per_job.append(
            {
                "name": row["name"],
                "job": job.job,
                "claim_mib": row["claims_mib"][:1],
                "nvml_peak_mib": row["nvml_peak_mib"],
                "job_peak_mib": round(job_peak / MiB) if job_peak else None,
                "fits": bool(claim and (peak is None or peak <= claim)),
                "within_margin": bool(job_peak and claim and claim <= margin(job_peak)),
                "claim_over_nvml_peak": round(claim / peak, 3) if claim and peak else None,
            }
        )
    return {
        "all_finished": all(r["rc"] == 0 for r in rows),
        "no_oom": not any(r["oom"] for r in rows),
        "all_sized_by_profile": all(r["sized"] == "profile" for r in rows),
        "every_claim_fits_and_within_margin": all(
            p["fits"] and p["within_margin"] for p in per_job
        ),
        "per_job": per_job,
    }


def margin(peak: int) -> int:
    return math.ceil((peak * 1.10 + 64 * MiB) / MiB) * MiB


def phase_hand(runner: Runner, budget: float, per_kind: int, size: int) -> dict[str, Any]:
    jobs = [
        runner.job(kind, f"{size // MiB}MiB", {"MEMGOV_JOB": f"hand-{kind}"})
        for _ in range(per_kind)
        for kind in KINDS
    ]
    deadline = time.monotonic() + budget
    with Watch(runner.smoke) as watch:
        runner.start(jobs)
        runner.wait(jobs, deadline, watch)
    rows = [j.summary(watch.peaks) for j in jobs]
    refused = [r for r in rows if any("cannot claim" in ln for ln in r["tail"] + r["memgov_lines"])]
    return {
        "size_mib": size // MiB,
        "jobs": rows,
        "admitted_at_once": watch.most_claims,
        "finished": sum(r["rc"] == 0 for r in rows),
        "refused": len(refused),
        "device_peak_mib": round(watch.device_peak / MiB),
        "claimed_peak_mib": round(watch.claimed_peak / MiB),
    }


def phase_beside(runner: Runner, budget: float, neighbours: int) -> dict[str, Any]:
    before = [runner.job("mnist") for _ in range(neighbours // 2)]
    after = [runner.job("mnist") for _ in range(neighbours - neighbours // 2)]
    first = runner.job(
        "gpt2",
        env={"MEMGOV_GIVE_BACK": f"{runner.args.give_back:g}"},
        gpt2_args=runner.args.beside_gpt2_args.split(),
    )
    deadline = time.monotonic() + budget
    with Watch(runner.smoke) as watch:
        runner.start(before)
        wait_admitted(watch, before, deadline)
        runner.start([first])
        wait_admitted(watch, [first], deadline)
        runner.start(after)
        runner.wait([*before, first, *after], deadline, watch)
    rows = [j.summary(watch.peaks) for j in [*before, *after]]
    newcomer = first.summary(watch.peaks)
    return {
        "first_run": newcomer,
        "neighbours": rows,
        "neighbours_ok": sum(r["rc"] == 0 for r in rows),
        "neighbours_n": len(rows),
        "none_failed": all(r["rc"] == 0 and not r["oom"] for r in rows),
        "first_run_sized": newcomer["sized"],
        "first_run_claims_mib": newcomer["claims_mib"],
        "device_peak_mib": round(watch.device_peak / MiB),
    }


def device_info(smoke: bool) -> dict[str, Any]:
    from memgov._gpu import devices as _devices

    d = _devices.devices()[0]
    return {"name": d.name, "uuid": d.uuid, "total_mib": d.total // MiB, "smoke": smoke}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scripts", required=True, help="folder with mnist/main.py, dcgan/main.py")
    parser.add_argument("--out", required=True)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--per-kind", type=int, default=10)
    parser.add_argument("--neighbours", type=int, default=4)
    parser.add_argument("--beside", type=int, default=24)
    parser.add_argument("--give-back", type=float, default=10.0)
    # batch 4: 10 copies at batch 8 (9.7 GiB each) with 20 others exceed an H200's budget.
    parser.add_argument("--gpt2-args", default="--batch 4 --seq 512 --steps 20")
    parser.add_argument("--beside-gpt2-args", default="--batch 4 --seq 512 --steps 150")
    parser.add_argument("--phases", default="first,auto,hand,beside")
    parser.add_argument("--budget", type=float, default=520.0)
    args = parser.parse_args()
    for script in ("mnist/main.py", "dcgan/main.py"):
        if not (Path(args.scripts) / script).is_file():
            raise SystemExit(
                f"{args.scripts}/{script} is missing: carry the PyTorch examples' "
                "unchanged mnist/ and dcgan/ folders (benchmarks/gpu/auto_checks.sh)"
            )
    work = Path(tempfile.mkdtemp(prefix="memgov-auto-"))
    write_mnist(work / "data")
    runner = Runner(args, work)
    os.environ["MEMGOV_DIR"] = runner.base["MEMGOV_DIR"]  # the watcher reads this ledger
    if args.smoke:
        os.environ["MEMGOV_DEVICES"] = runner.base["MEMGOV_DEVICES"]
    report: dict[str, Any] = {"device": device_info(args.smoke), "args": vars(args)}
    t0 = time.monotonic()
    share = {"first": 0.2, "auto": 0.3, "hand": 0.2, "beside": 0.25}
    phases = args.phases.split(",")
    try:
        if "first" in phases:
            report["first"] = phase_first(runner, args.budget * share["first"])
            save(args.out, report, t0)
        if "auto" in phases:
            report["auto"] = phase_auto(runner, args.budget * share["auto"], args.per_kind)
            save(args.out, report, t0)
        if "hand" in phases:
            measured = [
                *report.get("auto", {}).get("jobs", []),
                *report.get("first", {}).get("first_runs", []),
            ]
            biggest = max((r["nvml_peak_mib"] or 0 for r in measured), default=0) * MiB
            size = math.ceil((biggest or 9 * GiB) / GiB) * GiB
            report["hand"] = phase_hand(runner, args.budget * share["hand"], args.per_kind, size)
            save(args.out, report, t0)
        if "beside" in phases:
            report["beside"] = phase_beside(runner, args.budget * share["beside"], args.beside)
    finally:
        save(args.out, report, t0)
        shutil.rmtree(work, ignore_errors=True)
    print_table(report)


def save(out: str, report: dict[str, Any], t0: float) -> None:
    report["seconds"] = round(time.monotonic() - t0, 1)
    Path(out).write_text(json.dumps(report, indent=1, sort_keys=True))


def print_table(report: dict[str, Any]) -> None:
    dev = report["device"]
    print(f"device {dev['name']} {dev['total_mib']:,} MiB{' (smoke)' if dev['smoke'] else ''}")
    for row in report.get("first", {}).get("first_runs", []):
        print(
            f"first run {row['kind']}: rc {row['rc']}, claims {row['claims_mib']} MiB "
            f"({row['sized']}), NVML peak {row['nvml_peak_mib']} MiB"
        )
    auto = report.get("auto")
    if auto:
        checks = {k: v for k, v in auto["checks"].items() if k != "per_job"}
        print(
            f"auto, {len(auto['jobs'])} at once: {checks}; device peak "
            f"{auto['device_peak_mib']:,} MiB, claimed {auto['claimed_peak_mib']:,} MiB"
        )
    hand = report.get("hand")
    if hand:
        print(
            f"hand-picked {hand['size_mib']:,} MiB for all: {hand['admitted_at_once']} "
            f"admitted at once, {hand['finished']} finished, {hand['refused']} refused; "
            f"device peak {hand['device_peak_mib']:,} MiB"
        )
    beside = report.get("beside")
    if beside:
        print(
            f"first run beside {beside['neighbours_n']} neighbours: {beside['neighbours_ok']}"
            f" ok, none failed: {beside['none_failed']}; first run "
            f"{beside['first_run_sized']} {beside['first_run_claims_mib']} MiB, rc "
            f"{beside['first_run']['rc']}"
        )


if __name__ == "__main__":
    main()
