"""Write the queue benchmark's job files (TOML for `memgov queue run`), seeded, into OUTDIR.

    python3 benchmarks/queue/make_mixes.py OUTDIR [--mix light,random] [--seed 0] [--jobs 30]
        [--examples .public/examples] [--claims auto|measured] [--measured FILE ...] [--tiny]

Mixes (kinds.py holds the kinds and what each measured alone):
  light   small jobs only: the PyTorch examples' unchanged mnist, vae and dcgan scripts and this
          repository's plain loop, at least --min-per-kind of each, the rest drawn at random
  random  jobs drawn at random from the small kinds and the big ones (GPT-2, ResNet-50, a wide
          DCGAN; 10-26 GiB each), redrawn until every big family is in, the jobs' peaks add up
          to more than --min-total-gib (no H100 or H200 holds them all at once)
Both are redrawn until the jobs' solo times add up to at most --max-solo-s (one at a time, the
queue and memgov's run of it fit one device call).

Every job gets its kind's ``duration`` hint (solo seconds), its own seed, an arrival time (gaps
drawn from an exponential of mean --arrival-gap seconds) and its own working folder, made here:
OUTDIR/jobs/MIX/NAME (the vae example writes images into results/ there; mnist and vae read
../data, a link to OUTDIR/data, written from the MNIST npz: the GPU machine has no network).
Claims: ``auto`` (the queue sizes each job from memgov's profiles; a kind's first run, with no
profile yet, gets memgov's first-run size: docs/profiles.md), or with ``--claims measured`` the
measured peak of each kind + 10 % + 64 MiB (the profiles' margin), from --measured files
(size_kinds.py's JSON lines or a queue report) or kinds.py's figures. --tiny: the same programs
with arguments that run on a CPU in seconds (smoke tests; torchvision and transformers needed
for the kinds that use them: pick others with --kinds).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shlex
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from kinds import BIG, KINDS, ROOT, SMALL, Kind  # noqa: E402

MIXES = ("light", "random")
MAX_SOLO_S = {"light": 320.0, "random": 340.0}  # about 10 s a job: start-up alone takes 7-14 s
DRAWS = 20000  # tries before a mix is declared impossible under its constraints
MIB = 2**20
GIB = 2**30


@dataclass
class Figures:
    """What one kind is expected to take alone: seconds and NVML peak MiB."""

    solo_s: float
    peak_mib: float


class MixError(Exception):
    """A mix cannot be made as asked; the message says what is accepted."""


def measured_figures(paths: list[Path]) -> dict[str, Figures]:
    """Per kind: the median solo time and the largest peak in size_kinds.py's JSON lines (times
    only where the line ran the kind's present arguments) or in queue reports (jobs with kind,
    run_s, peak_bytes; only an exclusive policy's report gives solo times: co-located jobs ran
    beside others). Kinds not found keep kinds.py's figures."""
    times: dict[str, list[float]] = {}
    peaks: dict[str, list[float]] = {}
    for path in paths:
        text = path.read_text()
        try:
            docs = [json.loads(text)]
        except json.JSONDecodeError:
            docs = [json.loads(x) for x in text.splitlines() if x.startswith("{")]
        for doc in docs:
            if "jobs" in doc:  # a queue report
                solo = str(doc.get("policy", "")).endswith("-exclusive")
                for job in doc["jobs"]:
                    if solo and job.get("end") in (None, "exit", "ok") and job.get("run_s"):
                        times.setdefault(job["kind"], []).append(float(job["run_s"]))
                    if job.get("peak_bytes"):
                        peaks.setdefault(job["kind"], []).append(job["peak_bytes"] / MIB)
            elif doc.get("kind") in KINDS and doc.get("rc") == 0:  # size_kinds.py
                # its time counts only for the arguments it ran with; its peak for any steps
                if doc.get("args") == list(KINDS[doc["kind"]].args):
                    times.setdefault(doc["kind"], []).append(float(doc["wall_s"]))
                peak = max(doc.get("nvml_peak_mib") or 0, doc.get("torch_peak_reserved_mib") or 0)
                if peak:
                    peaks.setdefault(doc["kind"], []).append(peak)
    out: dict[str, Figures] = {}
    for name, kind in KINDS.items():
        solo = statistics.median(times[name]) if name in times else kind.solo_s
        out[name] = Figures(round(solo, 1), max(peaks[name]) if name in peaks else kind.peak_mib)
    return out


def claim_for(peak_mib: float) -> str:
    """The profiles' margin: peak x 1.10 + 64 MiB, in whole MiB."""
    return f"{math.ceil(peak_mib * 1.10 + 64)}MiB"


def max_solo_s(args: argparse.Namespace, mix: str) -> float:
    return MAX_SOLO_S[mix] if args.max_solo_s is None else float(args.max_solo_s)


def draw_light(
    rng: random.Random,
    names: list[str],
    n: int,
    figures: dict[str, Figures],
    args: argparse.Namespace,
) -> tuple[list[str], int]:
    """--min-per-kind of each small kind, the rest drawn; redrawn until the solo times add up
    to at most --max-solo-s."""
    small = [k for k in names if k in SMALL]
    if not small:
        raise MixError(f"light: no small kind among --kinds; small kinds are {', '.join(SMALL)}")
    least = args.min_per_kind
    if least * len(small) > n:
        raise MixError(f"light: --min-per-kind {least} x {len(small)} kinds > --jobs {n}")
    for attempt in range(1, DRAWS + 1):
        picked = [k for k in small for _ in range(least)]
        picked += rng.choices(small, k=n - len(picked))
        rng.shuffle(picked)
        if sum(figures[k].solo_s for k in picked) <= max_solo_s(args, "light"):
            return picked, attempt
    raise MixError(
        f"light: no draw of {n} jobs in {DRAWS:,} has solo times adding up to <= "
        f"{max_solo_s(args, 'light')} s; change --max-solo-s, --min-per-kind or --jobs"
    )


def draw_random(
    rng: random.Random,
    names: list[str],
    n: int,
    figures: dict[str, Figures],
    args: argparse.Namespace,
) -> tuple[list[str], int]:
    """30 jobs, each big with probability --big-share; redrawn until the constraints hold."""
    small = [k for k in names if k in SMALL]
    big = [k for k in names if k in BIG]
    if not small or not big:
        raise MixError(
            "random: --kinds needs a small kind and a big one "
            f"(small: {', '.join(SMALL)}; big: {', '.join(BIG)})"
        )
    families = {KINDS[k].family for k in big}
    for attempt in range(1, DRAWS + 1):
        picked = [
            rng.choice(big) if rng.random() < args.big_share else rng.choice(small)
            for _ in range(n)
        ]
        total_gib = sum(figures[k].peak_mib for k in picked) * MIB / GIB
        solo = sum(figures[k].solo_s for k in picked)
        if (
            {KINDS[k].family for k in picked if k in BIG} == families
            and total_gib >= args.min_total_gib
            and solo <= max_solo_s(args, "random")
        ):
            return picked, attempt
    raise MixError(
        f"random: no draw of {n} jobs in {DRAWS:,} has every big family, peaks adding "
        f"up to >= {args.min_total_gib} GiB and solo times to <= {max_solo_s(args, 'random')} s; "
        "change --big-share, --min-total-gib, --max-solo-s or --jobs"
    )


def job_entry(
    name: str,
    kind: Kind,
    mix: str,
    seed: int,
    arrival: float,
    fig: Figures,
    args: argparse.Namespace,
) -> dict[str, Any]:
    extra = kind.tiny_args if args.tiny else kind.args
    cmd = [args.python, str(kind.script_path(args.examples)), *extra, kind.seed_option, str(seed)]
    entry: dict[str, Any] = {
        "name": name,
        "kind": kind.name,
        "cmd": cmd,
        "cwd": f"jobs/{mix}/{name}",
        "claim": claim_for(fig.peak_mib) if args.claims == "measured" else "auto",
        "arrival": round(arrival, 2),
        "duration": 3.0 if args.tiny else fig.solo_s,
    }
    if kind.family == "transformer":
        entry["env"] = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    if args.gpu is not None:
        entry["gpu"] = args.gpu
    return entry


def toml_value(value: Any) -> str:
    """TOML for the few types a job uses (a JSON string is a TOML basic string)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return (
            "{ " + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + " }"
        )
    raise TypeError(f"no TOML for {value!r}")


def render(mix: str, jobs: list[dict[str, Any]], header: list[str], policy: str) -> str:
    lines = [f"# {x}" for x in header] + ["", "[queue]", f"policy = {toml_value(policy)}"]
    for job in jobs:
        lines += ["", "[[job]]"] + [f"{k} = {toml_value(v)}" for k, v in job.items()]
    return "\n".join(lines) + "\n"


def make_mix(
    mix: str, args: argparse.Namespace, names: list[str], figures: dict[str, Figures]
) -> tuple[str, dict[str, Any], list[dict[str, Any]]]:
    rng = random.Random(f"{args.seed}:{mix}")
    if mix == "light":
        picked, attempts = draw_light(rng, names, args.jobs, figures, args)
    else:
        picked, attempts = draw_random(rng, names, args.jobs, figures, args)
    arrival = 0.0
    jobs = []
    for i, kind_name in enumerate(picked):
        fig = figures[kind_name]
        name = f"{kind_name}-{i:02d}"
        jobs.append(
            job_entry(name, KINDS[kind_name], mix, rng.randrange(1, 10**6), arrival, fig, args)
        )
        arrival += rng.expovariate(1 / args.arrival_gap) if args.arrival_gap > 0 else 0.0
    summary = {
        "mix": mix,
        "jobs": len(jobs),
        "draws": attempts,
        "per_kind": {k: picked.count(k) for k in sorted(set(picked))},
        "solo_s_sum": round(sum(figures[k].solo_s for k in picked), 1),
        "peak_gib_sum": round(sum(figures[k].peak_mib for k in picked) * MIB / GIB, 1),
        "big_jobs": sum(k in BIG for k in picked),
        "last_arrival_s": jobs[-1]["arrival"],
    }
    header = [
        f"memgov queue benchmark, {mix} mix: written by benchmarks/queue/make_mixes.py",
        "  " + shlex.join(["make_mixes.py", *sys.argv[1:]]),
        json.dumps(summary),
    ]
    return render(mix, jobs, header, args.policy), summary, jobs


def prepare_folders(out: Path, mix: str, jobs: list[dict[str, Any]], needs_data: bool) -> None:
    """Each job's working folder, and the MNIST link its examples read (../data)."""
    base = out / "jobs" / mix
    for job in jobs:
        (out / job["cwd"] / "results").mkdir(parents=True, exist_ok=True)
    if needs_data and not (base / "data").exists():
        (base / "data").symlink_to(Path("..") / ".." / "data")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("outdir", type=Path, help="the folder to write into (made if missing)")
    p.add_argument("--mix", default="light,random", help=f"comma-separated: {', '.join(MIXES)}")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=30)
    p.add_argument("--kinds", default=",".join(KINDS), help="the kinds to draw from")
    p.add_argument("--min-per-kind", type=int, default=4, help="light: jobs of each kind at least")
    p.add_argument("--big-share", type=float, default=0.35, help="random: chance a job is big")
    p.add_argument(
        "--min-total-gib",
        type=float,
        default=150.0,
        help="random: the jobs' peaks add up to this at least (an H200 has 140.4 GiB)",
    )
    p.add_argument(
        "--max-solo-s",
        type=float,
        help="the jobs' solo times add up to this at most (default: light "
        f"{MAX_SOLO_S['light']:g}, random {MAX_SOLO_S['random']:g}: one at a time, a "
        "mix and memgov's run of it fit one 10-minute device call)",
    )
    p.add_argument("--arrival-gap", type=float, default=0.5, help="mean seconds between arrivals")
    p.add_argument("--claims", choices=("auto", "measured"), default="auto")
    p.add_argument(
        "--measured",
        type=Path,
        action="append",
        default=[],
        help="size_kinds.py JSON lines or a queue report (repeatable)",
    )
    p.add_argument("--policy", default="memgov", help="the file's [queue] policy")
    p.add_argument("--gpu", type=int, help="pin every job to this GPU (default: the policy picks)")
    p.add_argument(
        "--examples",
        type=Path,
        default=ROOT / ".public" / "examples",
        help="a checkout of github.com/pytorch/examples (mnist, vae, dcgan)",
    )
    p.add_argument(
        "--mnist",
        type=Path,
        default=ROOT / "experiments" / "mnist" / "data" / "mnist.npz",
        help="MNIST as an npz (x_train, y_train, x_test, y_test)",
    )
    p.add_argument(
        "--data",
        type=Path,
        help="a folder holding MNIST/raw already (another mix's OUTDIR/data): linked, not written",
    )
    p.add_argument("--python", default=sys.executable, help="the interpreter the jobs run with")
    p.add_argument("--tiny", action="store_true", help="CPU arguments that run in seconds")
    args = p.parse_args(argv)
    args.examples = args.examples.resolve()
    mixes = [m for m in args.mix.split(",") if m]
    bad = [m for m in mixes if m not in MIXES]
    if bad or not mixes:
        p.error(f"--mix {args.mix!r}: accepted a comma-separated list of {', '.join(MIXES)}")
    args.mixes = mixes
    args.kind_names = [k for k in args.kinds.split(",") if k]
    bad = [k for k in args.kind_names if k not in KINDS]
    if bad or not args.kind_names:
        p.error(f"--kinds {args.kinds!r}: accepted a comma-separated list of {', '.join(KINDS)}")
    for name in ("jobs", "min_per_kind"):
        if getattr(args, name) < (1 if name == "jobs" else 0):
            p.error(
                f"--{name.replace('_', '-')} {getattr(args, name)}: accepted a whole number "
                f">= {1 if name == 'jobs' else 0}"
            )
    if not 0 <= args.big_share <= 1:
        p.error(f"--big-share {args.big_share}: accepted a number from 0 to 1")
    if args.arrival_gap < 0:
        p.error(f"--arrival-gap {args.arrival_gap}: accepted seconds >= 0")
    for path in args.measured:
        if not path.is_file():
            p.error(f"--measured {path}: no such file (size_kinds.py JSON lines or a queue report)")
    if args.tiny:  # on a CPU, no mix holds big memory or takes long
        args.min_total_gib, args.max_solo_s = 0.0, math.inf
    examples = [k for k in args.kind_names if KINDS[k].where == "examples"]
    missing = [
        str(KINDS[k].script_path(args.examples))
        for k in examples
        if not KINDS[k].script_path(args.examples).is_file()
    ]
    if missing:
        p.error(
            f"--examples {args.examples}: missing {', '.join(sorted(set(missing)))}; accepted "
            "a checkout of github.com/pytorch/examples, or --kinds without "
            f"{', '.join(sorted(set(examples)))}"
        )
    if args.data is not None:
        args.data = args.data.resolve()
        if not (args.data / "MNIST" / "raw").is_dir():
            p.error(f"--data {args.data}: no MNIST/raw folder in it (torchvision's layout)")
    elif any(KINDS[k].mnist_data for k in args.kind_names) and not args.mnist.is_file():
        p.error(
            f"--mnist {args.mnist}: no such file (an npz with x_train, y_train, x_test, y_test)"
        )
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        figures = measured_figures(args.measured)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SystemExit(
            f"--measured: {exc}; accepted size_kinds.py JSON lines or a queue report"
        ) from exc
    args.outdir.mkdir(parents=True, exist_ok=True)
    data_needed = False
    for mix in args.mixes:
        try:
            text, summary, jobs = make_mix(mix, args, args.kind_names, figures)
        except MixError as exc:
            print(f"make_mixes: {exc}", file=sys.stderr)
            return 2
        needs_data = any(KINDS[k].mnist_data for k in summary["per_kind"])
        data_needed |= needs_data
        path = args.outdir / f"{mix}.toml"
        path.write_text(text)
        prepare_folders(args.outdir, mix, jobs, needs_data)
        print(json.dumps({"file": str(path), **summary}), flush=True)
    if data_needed:
        provide_mnist(args.outdir / "data", args)
    return 0


def provide_mnist(folder: Path, args: argparse.Namespace) -> None:
    """torchvision's MNIST files at OUTDIR/data: a link to --data, else written from --mnist the
    way benchmarks/gpu/scripts_checks.py writes them (the GPU machine has no network)."""
    if (folder / "MNIST" / "raw").is_dir():
        return
    if args.data is not None:
        folder.symlink_to(args.data)
        return
    sys.path.insert(0, str(HERE.parent / "gpu"))
    from scripts_checks import write_mnist_raw

    write_mnist_raw(args.mnist, folder)


if __name__ == "__main__":
    sys.exit(main())
