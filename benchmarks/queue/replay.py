"""The queue's decisions replayed on a model of a GPU: every policy of the decision core, the
exact code `memgov queue run` calls (memgov.decide.place and memgov.decide.Learned), with jobs
that progress by a time-sharing model instead of real processes. A design tool, not a result:
the GPU machine's runs (benchmarks/gpu/queue_checks.sh) are the figures.

    python benchmarks/queue/replay.py [--set tuning|held-out] [--json]
    python benchmarks/queue/replay.py --tune     # memgov's candidates on the tuning set only

The model: a job is a start-up phase (``startup_s``, CPU-bound: GPU utilisation 0.05) and a
training phase (the rest of its solo time, at its kind's utilisation ``util``). Jobs on one GPU
progress at 1 / max(1, the sum of their utilisations): the GPU time-slices once its jobs ask
for more than it has. Memory: a job's claim is its kind's peak; what fits a GPU's capacity may
start. Kinds follow benchmarks/queue/kinds.py (solo times and peaks measured on an H200).

Mixes (drawn by seed): ``jobs`` jobs, a share of them big (10-26 GiB), arrivals at once (a
batch) or by exponential gaps; GPUs of 80 or 140 GiB, one or two. The tuning set and the
held-out set are different seeds and different shapes (HELD_OUT has other GPU counts, more big
jobs and bursts); the numbers of memgov's policy were chosen before either was run, and neither
set was used to change them.

Per mix and policy: cold (nothing learned; the jobs' duration hints, as make_mixes.py writes
them) and warm (from what sjf-exclusive learned on the same mix), makespan, mean JCT and p90
slowdown (run time / solo time).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
from dataclasses import dataclass, field
from typing import Any

from memgov import decide
from memgov.decide import policies

GIB = 1 << 30
STARTUP_UTIL = 0.05
KINDS = {  # name: (solo_s, peak GiB, start-up s, training utilisation)
    "mnist": (10.0, 1.36, 8.2, 0.35),
    "vae": (12.0, 0.81, 9.0, 0.30),
    "dcgan": (11.0, 3.26, 7.5, 0.60),
    "plain": (10.0, 0.86, 8.0, 0.45),
    "gpt2-b8": (15.0, 16.1, 14.5, 0.95),
    "gpt2-b12": (15.0, 23.5, 14.0, 0.97),
    "resnet-b96": (12.0, 10.4, 9.5, 0.90),
    "resnet-b256": (10.5, 25.9, 9.1, 0.95),
    "gan-wide": (14.0, 19.5, 8.0, 0.90),
}
SMALL = ("mnist", "vae", "dcgan", "plain")
BIG = tuple(k for k in KINDS if k not in SMALL)
POLICIES = ("memgov", "fifo", "tetris", "bestfit", "sjf-exclusive")


@dataclass(frozen=True)
class Shape:
    jobs: int
    big_share: float
    gpus: int
    gib: int
    gap_s: float
    """Mean arrival gap; 0: every job at once."""
    scale: float = 1.0
    """Training time times this (longer jobs: interference matters more)."""


TUNING = {
    **{f"t{seed}": (seed, Shape(20, 0.5, 1, 80, 0.5, 3.0)) for seed in range(5)},
    **{f"t{seed}-2gpu": (seed, Shape(24, 0.4, 2, 80, 0.0, 3.0)) for seed in range(5, 8)},
}
HELD_OUT = {
    **{f"h{seed}-batch": (seed, Shape(24, 0.4, 1, 80, 0.0, 4.0)) for seed in range(100, 103)},
    **{f"h{seed}-2gpu": (seed, Shape(30, 0.3, 2, 80, 0.5, 2.0)) for seed in range(200, 203)},
    **{f"h{seed}-small": (seed, Shape(40, 0.0, 1, 140, 0.2, 6.0)) for seed in range(300, 302)},
}


@dataclass
class Job:
    id: int
    kind: str
    arrival: float
    claim: int
    solo_s: float
    startup_s: float
    util: float
    done_s: float = 0.0
    """Solo-seconds of work done."""
    start: float | None = None
    end: float | None = None
    gpu: int | None = None
    beside: dict[str, float] = field(default_factory=dict)
    """Per other kind, job-seconds run beside it (the runner's overlap, before dividing)."""

    def util_now(self) -> float:
        return STARTUP_UTIL if self.done_s < self.startup_s else self.util


def mix(seed: int, shape: Shape) -> list[Job]:
    rng = random.Random(seed)
    jobs, t = [], 0.0
    for i in range(shape.jobs):
        kind = rng.choice(BIG if rng.random() < shape.big_share else SMALL)
        solo, peak, startup, util = KINDS[kind]
        solo = startup + (solo - startup) * shape.scale
        jobs.append(Job(i + 1, kind, t, int(peak * GIB * 1.1), solo, startup, util))
        t += rng.expovariate(1 / shape.gap_s) if shape.gap_s else 0.0
    return jobs


def run(name: str, jobs: list[Job], shape: Shape, learned: decide.Learned) -> dict[str, Any]:
    """Replay one policy on the mix; ``learned`` is updated as the runner updates it."""
    policy = decide.get(name)
    capacity = shape.gib * GIB
    jobs = [Job(j.id, j.kind, j.arrival, j.claim, j.solo_s, j.startup_s, j.util) for j in jobs]
    now, step, seen = 0.0, 0.1, -1
    while any(j.end is None for j in jobs):
        running = [j for j in jobs if j.start is not None and j.end is None]
        ready = [j for j in jobs if j.start is None and j.arrival <= now]
        # A decision when something changed (an arrival, an end), as the runner's are.
        events = len(ready) + 1000 * sum(j.end is not None for j in jobs)
        if ready and events != seen:
            seen = events
            _start(policy, ready, running, shape, capacity, learned, now)
            running = [j for j in jobs if j.start is not None and j.end is None]
        for gpu in range(shape.gpus):
            on = [j for j in running if j.gpu == gpu]
            rate = 1.0 / max(1.0, sum(j.util_now() for j in on))
            for j in on:
                j.done_s += rate * step
                for other in on:
                    if other is not j:
                        j.beside[other.kind] = j.beside.get(other.kind, 0.0) + step
        now += step
        for j in running:
            if j.done_s >= j.solo_s:
                j.end = now
                _learn(learned, j)
    return _figures(name, jobs)


def _start(
    policy: decide.Policy,
    ready: list[Job],
    running: list[Job],
    shape: Shape,
    capacity: int,
    learned: decide.Learned,
    now: float,
) -> None:
    gpus = []
    for index in range(shape.gpus):
        on = [j for j in running if j.gpu == index]
        rows = [
            decide.Running(j.id, j.kind, j.claim, j.start or 0.0, _expected(learned, j), j.util)
            for j in on
        ]
        gpus.append(decide.Gpu(index, capacity, capacity - sum(j.claim for j in on), rows))
    candidates = [
        decide.Candidate(
            j.id, j.kind, j.claim, _expected(learned, j), None, _util(learned, j), j.arrival
        )
        for j in ready
    ]
    view = decide.View(now, candidates, gpus, 16, learned)
    by_id = {j.id: j for j in ready}
    free = {g.index: g.free for g in gpus}
    for job_id, gpu in decide.place(policy, view):
        job = by_id[job_id]
        if job.claim <= free[gpu]:  # the engine's check
            free[gpu] -= job.claim
            job.start, job.gpu = now, gpu


def _expected(learned: decide.Learned, job: Job) -> float | None:
    return learned.expected(job.kind, job.kind, job.solo_s)  # the hint: make_mixes.py's


def _util(learned: decide.Learned, job: Job) -> float:
    return learned.util.get(job.kind, 1.0)


def _learn(learned: decide.Learned, job: Job) -> None:
    assert job.start is not None and job.end is not None
    run_s = job.end - job.start
    overlap = {k: v / run_s for k, v in job.beside.items()}
    solo = learned.expected(job.kind, job.kind, None)
    learned.finished(job.kind, job.kind, run_s, overlap, solo)
    if sum(overlap.values()) < 0.05:  # alone: NVML's utilisation, as the runner keeps it
        busy = job.startup_s * STARTUP_UTIL + (job.solo_s - job.startup_s) * job.util
        learned.util[job.kind] = round(busy / job.solo_s, 3)


def _figures(name: str, jobs: list[Job]) -> dict[str, Any]:
    ends = [j.end or 0.0 for j in jobs]
    jct = [(j.end or 0.0) - j.arrival for j in jobs]
    slow = sorted(((j.end or 0.0) - (j.start or 0.0)) / j.solo_s for j in jobs)
    p90 = slow[max(0, math.ceil(0.9 * len(slow)) - 1)]
    return {
        "policy": name,
        "makespan_s": round(max(ends) - min(j.arrival for j in jobs), 2),
        "mean_jct_s": round(statistics.mean(jct), 2),
        "p90_slowdown": round(p90, 2),
    }


def _hrrn(self: Any, view: decide.View) -> list[decide.Candidate]:
    """Candidate order: highest response ratio next, shortest first among equals."""
    typical = policies._typical_time(view.jobs)

    def key(job: decide.Candidate) -> tuple[float, float, float, int]:
        expected = job.expected_s or typical
        waited = max(0.0, view.now - job.arrival)
        return (-(waited + expected) / expected, expected, job.arrival, job.id)

    return sorted(view.jobs, key=key)


def _slack_first(self: Any, view: decide.View) -> list[decide.Candidate]:
    """Candidate order: the jobs whose expected time reaches the queue's memory-time bound
    (no slack) longest first, then the others by response ratio."""
    typical = policies._typical_time(view.jobs)
    capacity = sum(g.capacity for g in view.gpus) or 1
    area = sum(j.claim * (j.expected_s or typical) for j in view.jobs)
    for gpu in view.gpus:
        for r in gpu.running:
            area += r.claim * max(0.0, r.started + (r.expected_s or typical) - view.now)
    horizon = area / capacity
    rest = {j.id: i for i, j in enumerate(_hrrn(self, view))}

    def key(job: decide.Candidate) -> tuple[bool, float, int]:
        expected = job.expected_s or typical
        if expected >= horizon:
            return (False, -expected, 0)
        return (True, 0.0, rest[job.id])

    return sorted(view.jobs, key=key)


ORDERS = {"arrival (chosen)": None, "response ratio": _hrrn, "no slack first": _slack_first}
RESERVE_AFTERS = (1.0, 3.0, math.inf)


def tune() -> None:
    """memgov's candidates (order x RESERVE_AFTER) on the tuning mixes, cold, against the best
    of fifo, tetris and bestfit: mixes within 3 % on both makespan and mean JCT, ratios."""
    chosen = (policies.Memgov.order, policies.RESERVE_AFTER)
    best: dict[str, tuple[float, float]] = {}
    for label, (seed, shape) in TUNING.items():
        jobs = mix(seed, shape)
        simple = [run(p, jobs, shape, decide.Learned()) for p in ("fifo", "tetris", "bestfit")]
        best[label] = (min(r["makespan_s"] for r in simple), min(r["mean_jct_s"] for r in simple))
    try:
        for order, fn in ORDERS.items():
            policies.Memgov.order = fn or chosen[0]  # type: ignore[method-assign]
            for after in RESERVE_AFTERS:
                policies.RESERVE_AFTER = after
                ms, js = [], []
                for label, (seed, shape) in TUNING.items():
                    r = run("memgov", mix(seed, shape), shape, decide.Learned())
                    ms.append(r["makespan_s"] / best[label][0])
                    js.append(r["mean_jct_s"] / best[label][1])
                both = sum(m <= 1.03 and j <= 1.03 for m, j in zip(ms, js, strict=True))
                print(
                    f"{order:<17} RESERVE_AFTER {after:<4g} both within 3 %: {both}/{len(ms)}; "
                    f"makespan worst {max(ms):.3f} median {statistics.median(ms):.3f}; "
                    f"mean JCT worst {max(js):.3f} mean {statistics.mean(js):.3f}"
                )
    finally:
        policies.Memgov.order, policies.RESERVE_AFTER = chosen  # type: ignore[method-assign]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--set", choices=("tuning", "held-out"), default="held-out")
    p.add_argument("--json", action="store_true")
    p.add_argument("--tune", action="store_true", help="memgov's candidates, tuning set only")
    args = p.parse_args()
    if args.tune:
        tune()
        return 0
    mixes = TUNING if args.set == "tuning" else HELD_OUT
    rows = []
    for label, (seed, shape) in mixes.items():
        jobs = mix(seed, shape)
        warm = decide.Learned()
        run("sjf-exclusive", jobs, shape, warm)  # what the baseline teaches
        for state in ("cold", "warm"):
            for name in POLICIES:
                learned = (
                    decide.Learned()
                    if state == "cold"
                    else decide.Learned.from_json(warm.to_json())
                )
                rows.append({"mix": label, "state": state, **run(name, jobs, shape, learned)})
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{'mix':<12} {'state':<5} {'policy':<14} {'makespan':>9} {'mean JCT':>9} {'p90':>6}")
    for r in rows:
        print(
            f"{r['mix']:<12} {r['state']:<5} {r['policy']:<14} {r['makespan_s']:>9.1f} "
            f"{r['mean_jct_s']:>9.1f} {r['p90_slowdown']:>6.2f}"
        )
    _verdict(rows)
    return 0


def _verdict(rows: list[dict[str, Any]]) -> None:
    """memgov against the best of fifo, tetris and bestfit per (mix, state): ratios."""
    keys = sorted({(r["mix"], r["state"]) for r in rows})
    ratios: dict[str, list[float]] = {"makespan_s": [], "mean_jct_s": []}
    for key in keys:
        group = {r["policy"]: r for r in rows if (r["mix"], r["state"]) == key}
        for metric in ratios:
            best = min(group[p][metric] for p in ("fifo", "tetris", "bestfit"))
            ratios[metric].append(group["memgov"][metric] / best)
    for metric, values in ratios.items():
        within = sum(v <= 1.03 for v in values)
        print(
            f"memgov / best simple, {metric}: median {statistics.median(values):.3f}, "
            f"worst {max(values):.3f}, within 3 % on {within} of {len(values)}"
        )


if __name__ == "__main__":
    raise SystemExit(main())
