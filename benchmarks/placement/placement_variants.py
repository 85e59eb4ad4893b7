"""Variants of FGD tried while designing memgov's policy, and a look at FGD's final state
(docs/placement.md, "memgov's policy, and how far it gets").

    python benchmarks/placement/placement_variants.py [--seeds 3] [--first-seed 42] [--workers 2] \
        [--out results/cpu-2core/2026-11-24-placement-variants.txt]
    python benchmarks/placement/placement_variants.py --look-ahead --seeds 10 --first-seed 0 \
        --out results/cpu-2core/2026-11-24-placement-look-ahead.txt

Each variant runs the default trace by the same protocol as the table (memgov/placement/
simulate.py); the final allocation per seed and the mean are printed and written to OUT.
``--look-ahead`` instead runs memgov's policy with each look-ahead in LOOK_AHEADS, and FGD, on
both traces: how `LOOK_AHEAD_JOBS` was chosen, on seeds 0-9, apart from the table's 42-51.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from memgov.decide import get as get_policy
from memgov.decide.fragmentation import TypicalJobs, fragment_after
from memgov.decide.model import MILLI, ClusterState
from memgov.decide.policies import FGD as FGDPolicy, Memgov as MemgovPolicy, Policy, Scores
from memgov.placement import Demand, load_nodes, load_trace, simulate
from memgov.placement.simulate import replay

DATA = Path(__file__).resolve().parents[2] / "benchmarks" / "placement" / "data"
VARIANTS = {
    "fgd": "FGD as published (integer score, ties to the node order)",
    "fgd, random ties": "FGD, ties broken at random per job",
    "gpupacking, random ties": "GpuPacking, ties broken at random per job",
    "exact": "FGD's fragment growth, exact (no integer score)",
    "exact, then packing": "integer score, ties by exact growth",
    "gpu-left ties": "integer score, ties by GPU milli left (fewest first)",
    "gpu-weighted typical": "typical jobs weighted by their GPUs",
    "all typical": "100 % of the workload as typical jobs, with memgov's two rules",
    "sigmoid/2000": "score over 2000 milli instead of 1000, with memgov's two rules",
    "sigmoid/500": "score over 500 milli instead of 1000",
    "order by GPUs": "ties to nodes with fewer GPUs first, with memgov's two rules",
    "fgd + two rules": "memgov's earlier policy (FGD, idle node -1.5, CPU-only jobs beside taken "
    "GPUs)",
    "memgov, stranding": "the earlier policy, -1 per idle GPU left beside fewer than 4 CPUs",
    "memgov": "memgov's policy (the waste expected over the next 8 typical jobs)",
}
LOOK_AHEADS = (2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, float("inf"))
"""memgov's look-ahead (`LOOK_AHEAD_JOBS`) tried on the tuning seeds (``--look-ahead``)."""
WORKLOADS = {
    "default": "openb_pod_list_default.csv",
    "gpushare100": "openb_pod_list_gpushare100.csv",
}


class RandomTies:
    """Another policy with its ties broken at random per job (not by the node order)."""

    cacheable = False
    exclusive = False

    def __init__(self, inner: Policy) -> None:
        self.inner, self.name = inner, inner.name

    def prepare(self, workload: Sequence[Demand]) -> None:
        self.inner.prepare(workload)

    def score(self, state: ClusterState, demand: Demand, nodes: Any, rng: Any) -> Scores:
        scores, gpu = self.inner.score(state, demand, nodes, rng)
        return scores + rng.random(len(scores)) * 1e-3, gpu  # integer scores: only ties move


class Variant(FGDPolicy):
    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode
        self.name = mode

    def prepare(self, workload: Sequence[Demand]) -> None:
        typical = TypicalJobs.of(workload, 1.0 if self.mode == "all typical" else 0.95)
        if self.mode == "gpu-weighted typical":
            weights = typical.frequency * typical.num_gpu * typical.gpu_milli / MILLI
            typical = dataclasses.replace(
                typical, frequency=weights / weights.sum(), cpu_only_frequency=0.0
            )
        self.typical = typical

    def score(self, state: ClusterState, demand: Demand, nodes: Any, rng: Any) -> Scores:
        mode, left = self.mode, state.gpu_left[nodes]
        if mode.startswith("exact"):
            before, after = fragment_after(self._typical(), state, demand, nodes)
            if after.ndim == 2:
                growth_per_gpu = np.where(np.isnan(after), np.inf, after - before[:, None])
                gpu = np.argmin(growth_per_gpu + left / 1e6, axis=1)
                growth = growth_per_gpu[np.arange(len(nodes)), gpu]
            else:
                growth, gpu = after - before, np.full(len(nodes), -1)
            if mode == "exact":
                return -growth, gpu
            coarse = np.trunc(100.0 / (1.0 + np.exp(growth / 1000.0)))
            return coarse - np.clip(growth + 1e5, 0, 2e5) / 4e5, gpu
        scale = {"sigmoid/2000": 2000.0, "sigmoid/500": 500.0}.get(mode, 1000.0)
        scores, gpu = self._scaled(state, demand, nodes, scale)
        if mode == "gpu-left ties":
            scores = scores - left.sum(axis=1) / 1e5
        if mode in (
            "all typical",
            "sigmoid/2000",
            "order by GPUs",
            "memgov, stranding",
            "fgd + two rules",
        ):
            scores, gpu = self._memgov_rules(state, demand, nodes, scores, gpu)
        if mode == "order by GPUs":
            scores = scores - state.gpu_count[nodes] * 1e-3 - state.priority[nodes] * 1e-7
        if mode == "memgov, stranding" and demand.num_gpu > 0:
            chosen = left[np.arange(len(nodes)), np.maximum(gpu, 0)] == MILLI
            idle_after = (left == MILLI).sum(axis=1) - (
                chosen if demand.shares_gpu else demand.num_gpu
            )
            starved = state.cpu_left[nodes] - demand.cpu_milli < 4000
            scores = scores - idle_after * starved
        return scores, gpu

    def _scaled(self, state: ClusterState, demand: Demand, nodes: Any, scale: float) -> Scores:
        before, after = fragment_after(self._typical(), state, demand, nodes)
        if after.ndim == 1:
            return _sigmoid(before - after, scale), np.full(len(nodes), -1)
        per_gpu = np.where(np.isnan(after), -1.0, _sigmoid(before[:, None] - after, scale))
        gpu = np.argmax(per_gpu, axis=1)
        return per_gpu[np.arange(len(nodes)), gpu], gpu

    def _memgov_rules(
        self, state: ClusterState, demand: Demand, nodes: Any, scores: Any, gpu: Any
    ) -> Scores:
        left = state.gpu_left[nodes]
        if demand.num_gpu == 0:
            return -left.sum(axis=1).astype(float), gpu
        idle = (state.cpu_left[nodes] == state.cpu_capacity[nodes]) & (
            left.sum(axis=1) == MILLI * state.gpu_count[nodes]
        )
        return scores - 1.5 * idle, gpu


def _sigmoid(drop: Any, scale: float) -> Any:
    with np.errstate(over="ignore", invalid="ignore"):
        return np.trunc(100.0 / (1.0 + np.exp(-drop / scale)))


def make(mode: str) -> Policy:
    if mode in ("fgd", "memgov"):
        return get_policy(mode)
    if mode.endswith(", random ties"):
        return RandomTies(get_policy(mode.split(",")[0]))
    return Variant(mode)


def run(mode: str, seed: int, workload: str = "default") -> float:
    jobs = load_trace(DATA / WORKLOADS[workload])
    nodes = load_nodes(DATA / "openb_node_list_gpu_node.csv")
    return simulate(jobs, nodes, make(mode), seed).final_percent


def run_look_ahead(look_ahead: float, seed: int, workload: str) -> float:
    """memgov's policy with another look-ahead; 0 stands for FGD (the yardstick)."""
    jobs = load_trace(DATA / WORKLOADS[workload])
    nodes = load_nodes(DATA / "openb_node_list_gpu_node.csv")
    policy = get_policy("fgd") if look_ahead == 0 else MemgovPolicy(look_ahead)
    return simulate(jobs, nodes, policy, seed).final_percent


def look_ahead_sweep(seeds: list[int], workers: int) -> list[str]:
    """memgov's look-ahead against FGD, per seed, on both traces: how LOOK_AHEAD_JOBS is chosen."""
    jobs = [(a, s, w) for w in WORKLOADS for a in (0.0, *LOOK_AHEADS) for s in seeds]
    with ProcessPoolExecutor(workers) as pool:
        finals = iter(list(pool.map(run_look_ahead, *zip(*jobs, strict=True))))
    lines = [f"final allocation % per seed {seeds[0]}-{seeds[-1]}; vs FGD: mean gain, seeds won"]
    for workload in WORKLOADS:
        fgd = np.array([next(finals) for _ in seeds])
        lines += [
            "",
            workload,
            f"{'fgd':14} {' '.join(f'{v:.2f}' for v in fgd)}  mean {fgd.mean():.2f}",
        ]
        for look_ahead in LOOK_AHEADS:
            got = np.array([next(finals) for _ in seeds])
            gain = got - fgd
            lines.append(
                f"{f'memgov, {look_ahead:g}':14} {' '.join(f'{v:.2f}' for v in got)}  mean "
                f"{got.mean():.2f}  vs fgd {gain.mean():+.2f}, {int((gain > 0).sum())} of "
                f"{len(seeds)}, worst {gain.min():+.2f}"
            )
    return lines


def diagnose(seed: int) -> list[str]:
    """Where FGD's idle GPU milli are at the end, and what failed (docs/placement.md)."""
    workload = load_trace(DATA / "openb_pod_list_default.csv")
    nodes = load_nodes(DATA / "openb_node_list_gpu_node.csv")
    result, state, jobs, placed = replay(workload, nodes, "fgd", seed)
    left = state.gpu_left[state.gpu_exists]
    partly = left[(left > 0) & (left < MILLI)]
    owner = np.repeat(np.arange(len(nodes)), state.gpu_count)
    whole = left == MILLI
    kind = Counter(
        "no GPU" if j.num_gpu == 0 else "sharing" if j.shares_gpu else f"{j.num_gpu} whole"
        for j, p in list(zip(jobs, placed, strict=True))[-2000:]
        if p is None
    )
    sharing = Counter(d.gpu_milli for d in workload if d.shares_gpu)
    small = sum(count for milli, count in sharing.items() if milli <= 190)
    return [
        f"FGD, seed {seed}: final {result.final_percent} %, idle GPU milli {int(left.sum())}",
        f"  on {len(partly)} partly used GPUs: {int(partly.sum())} milli; left per such GPU, "
        f"percentiles 10/25/50/75/90: {np.percentile(partly, [10, 25, 50, 75, 90]).tolist()}",
        f"  whole idle GPUs: {int(whole.sum())}; CPU milli left on their nodes: "
        f"{state.cpu_left[owner[whole]].tolist()}",
        f"  failed among the last 2000 arrivals: {dict(kind)}",
        f"  most common sharing requests (milli: jobs): {sharing.most_common(5)}; jobs asking "
        f"<= 190 milli: {small} of {sum(sharing.values())}",
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--first-seed", type=int, default=42)
    parser.add_argument("--look-ahead", action="store_true", help="sweep memgov's look-ahead")
    parser.add_argument("--out", default="results/cpu-2core/2026-11-24-placement-variants.txt")
    args = parser.parse_args()
    if args.seeds < 1 or args.workers < 1 or args.first_seed < 0:
        parser.error("--seeds and --workers: accepted whole numbers >= 1; --first-seed >= 0")
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    if args.look_ahead:
        command = (
            "command: python benchmarks/placement/placement_variants.py --look-ahead "
            f"--seeds {args.seeds} --first-seed {args.first_seed} --workers {args.workers}"
        )
        lines = [command, *look_ahead_sweep(seeds, args.workers)]
        Path(args.out).write_text("\n".join(lines) + "\n")
        print("\n".join(lines))
        return 0
    jobs = [(mode, seed) for mode in VARIANTS for seed in seeds]
    with ProcessPoolExecutor(args.workers) as pool:
        finals = list(pool.map(run, *zip(*jobs, strict=True)))
    lines = [
        f"command: python benchmarks/placement/placement_variants.py --seeds {args.seeds} "
        f"--first-seed {args.first_seed} --workers {args.workers}",
        f"default trace, final allocation % per seed {seeds[0]}-{seeds[-1]}, and the mean",
        "",
    ]
    for i, (mode, meaning) in enumerate(VARIANTS.items()):
        got = finals[i * len(seeds) : (i + 1) * len(seeds)]
        lines.append(f"{mode:24} {' '.join(f'{v:.2f}' for v in got)}  mean {np.mean(got):.2f}")
        lines.append(f"{'':24} ({meaning})")
    lines += ["", *diagnose(42)]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
