"""The queue benchmark's table: one row per policy's report (`memgov queue run --out`).

    python3 benchmarks/queue/summarize.py [--mix light] [--baseline sjf-exclusive] [--json]
        REPORT.json ...

Columns: policy, makespan, its ratio to the baseline's (sjf-exclusive: one job at a time,
shortest first), the mean job completion time (end - arrival), the 90th percentile of the jobs'
slowdowns against their solo runs, OOMs, jobs killed by a neighbour, the slowest placement
decision, and how many jobs ended well. Then the goals of memgov's default policy (docs/queue.md):
makespan and mean JCT each within GOAL_WITHIN (3 %) of the best of the simple policies that ran
(SIMPLE: fifo, tetris, bestfit), and the table as markdown for docs/queue.md.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

GOAL_WITHIN = 0.03
"""memgov's makespan and mean JCT at most 3 % above the best simple policy's (run-to-run noise)."""
SIMPLE = ("fifo", "tetris", "bestfit")
GOAL_DECISION_MS = 1000.0
FIRST = ("sjf-exclusive", "memgov")


def percentile(values: list[float], q: float) -> float | None:
    """Nearest rank: the smallest value with at least q of the values at or below it."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def row(report: dict[str, Any], baseline_s: float | None, source: str) -> dict[str, Any]:
    jobs = report.get("jobs") or []
    slowdowns = [float(j["slowdown"]) for j in jobs if j.get("slowdown") is not None]
    makespan = report.get("makespan_s")
    jcts = [float(j["jct_s"]) for j in jobs if j.get("jct_s") is not None]
    decisions = report.get("decisions") or {}
    return {
        "policy": report.get("policy", "?")
        + (f" --max-slowdown {report['max_slowdown']}" if report.get("max_slowdown") else ""),
        "max_slowdown": report.get("max_slowdown"),
        "makespan_s": makespan,
        "ratio": round(makespan / baseline_s, 3) if makespan and baseline_s else None,
        "mean_jct_s": round(sum(jcts) / len(jcts), 2) if jcts else None,
        "p90_slowdown": percentile(slowdowns, 0.9),
        "slowdowns": len(slowdowns),
        "ooms": report.get("ooms"),
        "killed_by_neighbour": report.get("killed_by_neighbour"),
        "retries": report.get("retries"),
        "max_decision_ms": decisions.get("max_ms"),
        "decisions": decisions.get("count"),
        "ok": sum(1 for j in jobs if j.get("end") == "ok"),
        "jobs": len(jobs),
        "interrupted": report.get("interrupted"),
        "device": (report.get("device") or {}).get("name"),
        "source": source,
    }


def per_kind(report: dict[str, Any]) -> list[str]:
    """Each kind's jobs in one report: how many, median run seconds, largest peak (an exclusive
    run's figures are solo figures: make_mixes.py --measured takes the report to resize)."""
    kinds: dict[str, list[dict[str, Any]]] = {}
    for job in report.get("jobs") or []:
        kinds.setdefault(job.get("kind") or "?", []).append(job)
    lines = []
    for kind, jobs in sorted(kinds.items()):
        runs = sorted(float(j["run_s"]) for j in jobs if j.get("run_s"))
        peak = max((j.get("peak_bytes") or 0 for j in jobs), default=0) / 2**20
        median = runs[len(runs) // 2] if runs else None
        lines.append(
            f"  {kind:<16} {len(jobs):>3} jobs, median run {fmt(median, ' s', 1)}, "
            f"peak {peak:,.0f} MiB, OOMs {sum(j.get('ooms') or 0 for j in jobs)}"
        )
    return lines


def load(paths: list[Path], baseline: str) -> list[dict[str, Any]]:
    reports = []
    for path in paths:
        try:
            reports.append((json.loads(path.read_text()), path.name))
        except (OSError, ValueError) as exc:
            raise SystemExit(
                f"summarize: {path}: {exc}; accepted a `memgov queue run` report"
            ) from None
    base = next(
        (r for r, _ in reports if r.get("policy") == baseline and not r.get("interrupted")), None
    )
    baseline_s = base.get("makespan_s") if base else None
    rows = [row(r, baseline_s, name) | {"per_kind": per_kind(r)} for r, name in reports]
    order = {p: i for i, p in enumerate(FIRST)}
    return sorted(rows, key=lambda r: (order.get(r["policy"], len(order)), r["policy"]))


def fmt(value: Any, unit: str = "", digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}{unit}"
    return f"{value}{unit}"


CELLS = (
    ("policy", lambda r: r["policy"] + (" (cut short)" if r["interrupted"] else "")),
    ("makespan", lambda r: fmt(r["makespan_s"], " s", 1)),
    ("vs sjf-exclusive", lambda r: fmt(r["ratio"], "x", 3)),
    ("mean JCT", lambda r: fmt(r["mean_jct_s"], " s", 1)),
    ("p90 slowdown", lambda r: fmt(r["p90_slowdown"], "x")),
    ("OOMs", lambda r: fmt(r["ooms"])),
    ("killed by neighbour", lambda r: fmt(r["killed_by_neighbour"])),
    ("max decision", lambda r: fmt(r["max_decision_ms"], " ms", 1)),
    ("jobs ok", lambda r: f"{r['ok']}/{r['jobs']}"),
)


def table(rows: list[dict[str, Any]]) -> str:
    cells = [[name for name, _ in CELLS]] + [[get(r) for _, get in CELLS] for r in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(CELLS))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in cells
    )


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(name for name, _ in CELLS) + " |", "|" + "---|" * len(CELLS)]
    lines += ["| " + " | ".join(get(r) for _, get in CELLS) + " |" for r in rows]
    return "\n".join(lines)


def goals(rows: list[dict[str, Any]], mix: str | None) -> list[str]:
    """The goals of memgov's default policy, each met or not (``mix`` is only named)."""
    mine = next((r for r in rows if r["policy"] == "memgov"), None)
    if mine is None:
        return ["memgov: no report"]
    checks = [
        ("0 jobs killed by a neighbour", mine["killed_by_neighbour"] == 0),
        (
            "each decision < 1 s",
            mine["max_decision_ms"] is not None and mine["max_decision_ms"] < GOAL_DECISION_MS,
        ),
        ("every job ended well", mine["jobs"] > 0 and mine["ok"] == mine["jobs"]),
        ("the run was not cut short", not mine["interrupted"]),
    ]
    simple = [r for r in rows if r["policy"] in SIMPLE and not r["interrupted"]]
    for key, what in (("makespan_s", "makespan"), ("mean_jct_s", "mean JCT")):
        values = [r[key] for r in simple if r[key] is not None]
        if values and mine[key] is not None:
            best = min(values)
            checks.insert(
                0,
                (
                    f"{what} within {GOAL_WITHIN:.0%} of the best simple policy's ({best:.1f} s)",
                    mine[key] <= best * (1 + GOAL_WITHIN),
                ),
            )
    for bounded in (r for r in rows if r["max_slowdown"] and r["p90_slowdown"] is not None):
        checks.append(
            (
                f"{bounded['policy']}: measured p90 slowdown {bounded['p90_slowdown']:.2f}x "
                f"at or under the bound",
                bounded["p90_slowdown"] <= bounded["max_slowdown"],
            )
        )
    return [f"memgov goal: {what}: {'met' if ok else 'NOT met'}" for what, ok in checks]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("reports", type=Path, nargs="+")
    p.add_argument("--mix", help="the mix's name (printed with the goals)")
    p.add_argument("--baseline", default="sjf-exclusive")
    p.add_argument("--json", action="store_true", help="the rows as JSON")
    args = p.parse_args()
    rows = load(args.reports, args.baseline)
    if args.json:
        print(json.dumps({"mix": args.mix, "rows": rows, "goals": goals(rows, args.mix)}, indent=1))
        return 0
    device = next((r["device"] for r in rows if r["device"]), "?")
    # the table and the goals last: a device call's reply keeps the end of the output
    print("markdown (docs/queue.md):\n")
    print(markdown(rows))
    print("\nraw: " + ", ".join(r["source"] for r in rows))
    for r in rows:
        if r["policy"] in (args.baseline, "memgov"):
            print(f"{r['policy']}, per kind:", *r["per_kind"], sep="\n")
    print(f"\nqueue {args.mix or ''} on {device} (ratios vs {args.baseline})")
    print(table(rows))
    print("\n".join(goals(rows, args.mix)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
