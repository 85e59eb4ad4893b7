"""How threads_checks.py turns per-job epochs into rates and ratios (pack's bases, so pack and the
plain scripts compare): "all ran", "span", "all ran steady" and "launch span", the load while all
ran, and per-round ratios with their medians. Kept apart from the runs, which start processes."""

from __future__ import annotations

import statistics
from typing import Any


def aggregate(jobs: list[dict[str, Any]], launch: float) -> dict[str, Any]:
    """The same two figures as `memgov pack` (memgov/pack/stats.py), so pack and the plain
    scripts compare on one basis, plus a steady window and a span from the launch.

    Every job's epochs count, also those of a job that failed later (its JSON is written after
    each epoch): a window is computed whenever every job reported the epochs it needs."""
    epochs = [e for j in jobs for e in j["epochs"]]
    ok = sum(1 for j in jobs if j["ok"])
    result: dict[str, Any] = {"ok": ok, "n": len(jobs)}
    if not epochs:
        return result
    total = sum(e["samples"] for e in epochs)
    first, end = min(e["t0"] for e in epochs), max(e["t1"] for e in epochs)
    result["span_s"] = round(end - first, 2)
    # pack's span: first epoch start to last epoch end (start-up stagger counts against it).
    result["samples_per_s_span"] = round(total / (end - first), 1) if end > first else None
    # Also from the first launch: interpreter and framework start-up included.
    result["samples_per_s_launch_span"] = round(total / (end - launch), 1)
    result["launch_span_s"] = round(end - launch, 2)
    every = [j["epochs"] for j in jobs]
    steady = [[e for e in js if e["epoch"] >= 1] for js in every]
    result["first_epoch_s_median"] = round(
        statistics.median(js[0]["seconds"] for js in every if js), 3
    )
    result["start_s_median"] = round(
        statistics.median(js[0]["t0"] - launch for js in every if js), 3
    )
    if all(every):
        # pack's "while all ran": latest first-epoch start to earliest last-epoch end.
        result.update(_window(every, "all_ran"))
    else:
        result["all_ran_note"] = "some job reported no epoch"
    # Without first epochs (CUDA/cuDNN set-up, XLA compilation).
    if all(steady):
        result.update(_window(steady, "all_ran_steady"))
        secs = [e["seconds"] for js in steady for e in js]
        result["steady_epoch_s_median"] = round(statistics.median(secs), 3)
    else:
        result["all_ran_steady_note"] = "some job reported fewer than two epochs"
    threads = [e.get("framework_threads") for e in epochs if e.get("framework_threads")]
    if threads:
        result["framework_threads_seen"] = sorted(set(threads))
    result["os_threads_max"] = max(e.get("os_threads", 0) for e in epochs)
    return result


def _window(per_job: list[list[dict[str, Any]]], name: str) -> dict[str, Any]:
    lo = max(js[0]["t0"] for js in per_job)
    hi = min(js[-1]["t1"] for js in per_job)
    if hi <= lo:
        return {
            f"samples_per_s_{name}": None,
            f"{name}_window_s": 0.0,
            f"{name}_note": f"never open: the last job entered at {lo - hi:.2f} s after the "
            "first one left (jobs did not all run at once)",
        }
    inside = sum(e["samples"] * _overlap(e, lo, hi) for js in per_job for e in js)
    return {
        f"samples_per_s_{name}": round(inside / (hi - lo), 1),
        f"{name}_window_s": round(hi - lo, 2),
        f"{name}_from": round(lo, 3),
        f"{name}_to": round(hi, 3),
    }


def _overlap(e: dict[str, Any], lo: float, hi: float) -> float:
    length = e["t1"] - e["t0"]
    if length <= 0:
        return 0.0
    return max(0.0, min(hi, e["t1"]) - max(lo, e["t0"])) / length


def pack_rates(rep: dict[str, Any]) -> dict[str, Any]:
    """pack's main run on this script's bases, from its report's epoch spans ([start, end,
    samples], seconds from the run's start, which comes right after the warm-up job)."""
    jobs = rep.get("jobs") or []
    if not jobs:
        return {}
    warm = rep.get("warm_up") or {}
    before = float(warm.get("stopped_s") or 0.0)  # the warm-up ran before the run's clock
    # Spans count from the run's start; on the wall clock where pack says when that was, so that
    # the windows line up with the load samples.
    runs = rep.get("runs") or [{}]
    zero = float(rep.get("started_unix") or runs[-1].get("started_unix") or 0.0)
    per_job = []
    for j in jobs:
        spans = j.get("epoch_spans") or []
        epochs = [
            {"epoch": k, "t0": zero + a, "t1": zero + b, "samples": n, "seconds": b - a}
            for k, (a, b, n) in enumerate(spans)
        ]
        per_job.append({"ok": j.get("status") == "ok", "epochs": epochs})
    result = aggregate(per_job, zero - before)
    result["warm_up"] = warm or None
    result["prepared"] = [j.get("prepared") for j in jobs][:3]
    result["start_s_median_note"] = "from the warm-up job's launch (warm-up seconds included)"
    return result


# -- summary ------------------------------------------------------------------------------------
def summary(conds: dict[str, dict[str, Any]]) -> dict[str, Any]:
    def rate(name: str, basis: str) -> float | None:
        value = (conds.get(name) or {}).get(f"samples_per_s_{basis}")
        return value if isinstance(value, (int, float)) else None

    def ratio(a: str, b: str, basis: str) -> float | None:
        x, y = rate(a, basis), rate(b, basis)
        return round(x / y, 3) if x and y else None

    pairs = {
        "1a_memgov_mps_vs_hand_mps": ("memgov_mps", "hand_mps", "must >= 0.9"),
        "1b_memgov_vs_hand": ("memgov", "hand", "must >= 0.9"),
        "2_stagger_memgov_vs_hand": (
            "memgov_mps_stagger",
            "hand_mps_stagger",
            "must >= 0.8 (span)",
        ),
        "2x_stagger_once_vs_hand": ("memgov_once_stagger", "hand_mps_stagger", "design option"),
        "3_pack_vs_hand_mps": ("pack", "hand_mps", "must >= 1.0"),
        # Where pack's figure comes from: its trainer (the same job started by hand, no memgov)
        # against the plain scripts, and pack against that same trainer (what governing costs).
        "3t_trainer_mps_vs_hand_mps": ("trainer_mps", "hand_mps", "pack's trainer by hand"),
        "3g_pack_vs_trainer_mps": ("pack", "trainer_mps", "pack vs its trainer by hand"),
    }
    for name in conds:
        variant = name.split("@")[0]
        if variant.startswith("pack_") or variant.startswith("trainer_mps_"):
            pairs[f"3v_{variant}_vs_hand_mps"] = (variant, "hand_mps", "variant")
    bases = ("all_ran", "span", "all_ran_steady", "launch_span")
    rounds = sorted({int(n.split("@")[1]) for n in conds if "@" in n} | {1})
    out: dict[str, Any] = {}
    for key, (a0, b0, goal) in pairs.items():
        for r in rounds:
            a, b = (a0, b0) if r == 1 else (f"{a0}@{r}", f"{b0}@{r}")
            if a in conds and b in conds:
                out[key if r == 1 else f"{key}@{r}"] = {
                    "goal": goal,
                    **{k: ratio(a, b, k) for k in bases},
                    a: {k: rate(a, k) for k in bases},
                    b: {k: rate(b, k) for k in bases},
                }
        if len(rounds) > 1:
            per_round = [out.get(key if r == 1 else f"{key}@{r}") for r in rounds]
            if all(x and x["all_ran"] is not None for x in per_round):
                out[f"{key}_median"] = {
                    "goal": f"{goal}; median of {len(rounds)} rounds",
                    **{
                        k: (round(statistics.median(v), 3) if len(v) == len(rounds) else None)
                        for k in bases
                        for v in [[x[k] for x in per_round if x and x[k] is not None]]
                    },
                }
    out["ok"] = {k: f"{v.get('ok')}/{v.get('n')}" for k, v in conds.items() if "n" in v}
    return out


def line(name: str, r: dict[str, Any]) -> str:
    load = r.get("load_all_ran") or {}
    return (
        f"--- {name}: ok {r.get('ok')}/{r.get('n')}, all ran {r.get('samples_per_s_all_ran')}"
        f" samples/s, span {r.get('samples_per_s_span')}, steady "
        f"{r.get('samples_per_s_all_ran_steady')}, launch span "
        f"{r.get('samples_per_s_launch_span')}; windows {r.get('all_ran_window_s')} / "
        f"{r.get('all_ran_steady_window_s')} s; start {r.get('start_s_median')} s, first epoch "
        f"{r.get('first_epoch_s_median')} s, steady epoch {r.get('steady_epoch_s_median')} s "
        f"(medians), threads {r.get('framework_threads_seen')}; while all ran: CPU busy "
        f"{load.get('cpu_busy')}, runnable {load.get('runnable')}, GPU util {load.get('gpu_util')}"
    )
