"""A pack's report files: report.json, report.csv (a row per job), plot.png, and a summary table.

matplotlib (Agg) and rich are imported only here, inside the functions that use them.
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path
from typing import Any

PLOTS_INSTALL = "pip install 'memgov-gpu[plots]'"

CSV_COLUMNS = (
    "run",
    "role",
    "n",
    "mode",
    "mps",
    "index",
    "label",
    "status",
    "reason",
    "exit_code",
    "signal",
    "rogue_mib",
    "footprint_mib",
    "claim_mib",
    "claim_mode",
    "rss_mib",
    "uss_mib",
    "epochs_done",
    "epoch_s",
    "steady_epoch_s",
    "samples",
    "samples_per_s",
    "test_acc",
    "peak_allocator_mib",
    "started_s",
    "ended_s",
    "detail",
)


def write(report: dict[str, Any], out: Path) -> None:
    """Write plot.png, report.csv and report.json (last, so it names what was written)."""
    out.mkdir(parents=True, exist_ok=True)
    report["files"] = {
        "json": str(out / "report.json"),
        "csv": str(out / "report.csv"),
        "plot": None,
    }
    try:
        import matplotlib  # noqa: F401
    except ImportError:  # an optional extra: say how to get it, once, instead of a traceback
        report["files"]["plot_error"] = f"not drawn: matplotlib is not installed ({PLOTS_INSTALL})"
    else:
        try:
            plot(report, out / "plot.png")
            report["files"]["plot"] = str(out / "plot.png")
        except Exception as exc:  # a figure it cannot draw: the data still counts
            report["files"]["plot_error"] = f"{type(exc).__name__}: {exc}"
    _atomic(out / "report.csv", _csv(report))
    _atomic(out / "report.json", json.dumps(report, indent=1, allow_nan=False) + "\n")


def _atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8", newline="") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _csv(report: dict[str, Any]) -> str:
    import io

    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_COLUMNS, extrasaction="ignore")
    writer.writeheader()
    for run in report["runs"]:
        for job in run["jobs"]:
            row = {
                **job,
                "run": run["label"],
                "role": run["role"],
                "n": run["n"],
                "mode": run["mode"],
                "mps": run["mps"],
            }
            row["epoch_s"] = ";".join(f"{s:g}" for s in job["epoch_s"])
            writer.writerow(row)
    return buffer.getvalue()


# -- the plot ------------------------------------------------------------------------------------
def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mains = [r for r in report["runs"] if r["role"] == "main"]
    if report.get("sweep") and len(mains) > 1:
        fig = _sweep_figure(plt, report, mains)
    else:
        fig = _runs_figure(plt, report, [r for r in report["runs"] if r["role"] != "solo"])
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _title(report: dict[str, Any]) -> str:
    where = report["device"]["name"] if report.get("device") else "CPU"
    return (
        f"memgov pack: {report['experiment']} / {report['framework']} / {report['mode']} on {where}"
    )


def _runs_figure(plt: Any, report: dict[str, Any], runs: list[dict[str, Any]]) -> Any:
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 7), sharex=True, constrained_layout=True)
    fig.suptitle(_title(report))
    colors = {"baseline": "tab:gray", "main": "tab:blue", "solo": "tab:green"}
    width = 0.8 / max(1, len(runs))
    gpu = any(j["footprint_mib"] is not None for r in runs for j in r["jobs"])
    key, label = (
        ("footprint_mib", "peak footprint, MiB (NVML)")
        if gpu
        else ("uss_mib", "host USS, MiB (CPU pack: no GPU footprint)")
    )
    for k, run in enumerate(runs):
        xs = [j["index"] + (k - (len(runs) - 1) / 2) * width for j in run["jobs"]]
        name = f"{run['label']} ({run['mode']}{', MPS' if run['mps'] else ''})"
        color = colors.get(run["role"])
        top.bar(xs, [j[key] or 0 for j in run["jobs"]], width=width, color=color, label=name)
        if run.get("claim_mib") and gpu:
            top.axhline(
                run["claim_mib"],
                color=color,
                linestyle="--",
                linewidth=1,
                label=f"claim {run['claim_mib']:g} MiB",
            )
        for j, x in zip(run["jobs"], xs, strict=True):
            bottom.scatter([x] * len(j["epoch_s"]), j["epoch_s"], s=12, color=color)
            if j["status"] != "ok":
                y = max(j["epoch_s"], default=0)
                bottom.scatter([x], [y], marker="x", s=60, color="tab:red")
                bottom.annotate(
                    j["reason"] or "failed",
                    (x, y),
                    fontsize=7,
                    color="tab:red",
                    rotation=60,
                    xytext=(2, 4),
                    textcoords="offset points",
                )
        bottom.scatter([], [], s=12, color=color, label=f"{name}: every epoch")
    solo = report.get("solo")
    if solo and solo["jobs"] and solo["jobs"][0]["steady_epoch_s"]:
        bottom.axhline(
            solo["jobs"][0]["steady_epoch_s"],
            color="tab:green",
            linestyle="--",
            linewidth=1,
            label="one job alone (steady epoch)",
        )
    from matplotlib.ticker import MaxNLocator

    for ax in (top, bottom):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    top.set_ylabel(label)
    bottom.set_ylabel("epoch time, s")
    bottom.set_xlabel("job")
    return fig


def _sweep_figure(plt: Any, report: dict[str, Any], runs: list[dict[str, Any]]) -> Any:
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.5), constrained_layout=True)
    fig.suptitle(_title(report) + " (sweep)")
    ns = [r["n"] for r in runs]
    foot, epoch, rate = axes
    if any(r["footprint_mib"] is not None for r in runs):
        foot.plot(ns, [r["footprint_mib"] for r in runs], "o-", label="median")
        foot.plot(ns, [r["footprint_max_mib"] for r in runs], "s--", label="max")
        foot.set_ylabel("peak footprint per job, MiB (NVML)")
    else:
        foot.plot(ns, [r["uss_per_job_mib"] for r in runs], "o-", label="median")
        foot.set_ylabel("host USS per job, MiB (CPU pack: no GPU footprint)")
    epoch.plot(ns, [r["epoch_s"] for r in runs], "o-", label="median steady epoch")
    epoch.set_ylabel("epoch time, s")
    rate.plot(ns, [r["aggregate_samples_per_s"] for r in runs], "o-", label="aggregate")
    solo = report.get("solo") or next((r for r in runs if r["n"] == 1), None)
    one = solo["jobs"][0].get("steady_samples_per_s") if solo and solo["jobs"] else None
    if one:
        rate.plot(ns, [one * n for n in ns], ":", color="tab:gray", label="N x one job")
    rate.set_ylabel("samples/s, all jobs")
    from matplotlib.ticker import MaxNLocator

    for ax in axes:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("jobs packed (N)")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    return fig


# -- the table -----------------------------------------------------------------------------------
def table(report: dict[str, Any]) -> Any:
    """One column per run, one row per figure (narrow enough for an 80-column terminal)."""
    from rich.table import Table

    runs = report["runs"]
    t = Table(title=_title(report), title_justify="left")
    t.add_column("")
    for run in runs:
        t.add_column(
            f"{run['label']}\n{run['mode']}{' +MPS' if run['mps'] else ''}", justify="right"
        )
    rows: list[tuple[str, Any]] = [
        ("jobs", lambda r: str(r["n"])),
        ("ok", lambda r: str(r["ok"])),
        ("failed", _failed),
        ("most jobs at once", _at_once),
        ("threads per job", lambda r: _num(r["threads_per_job"])),
        ("claim MiB", lambda r: _num(r["claim_mib"])),
        ("footprint MiB (median)", lambda r: _num(r["footprint_mib"])),
        ("footprint MiB (max)", lambda r: _num(r["footprint_max_mib"])),
        ("start-up s (median)", lambda r: _num(r.get("ready_s"), 1)),
        ("start-up s (max)", lambda r: _num(r.get("ready_s_max"), 1)),
        ("epoch s (median)", lambda r: _num(r["epoch_s"], 2)),
        ("samples/s, all jobs (a)", lambda r: _num(r["aggregate_samples_per_s"], 0)),
        ("  while all ran, s", lambda r: _num(r.get("window_s"), 1)),
        ("  over whole span", lambda r: _num(r["aggregate_samples_per_s_span"], 0)),
        ("x one job (a)", lambda r: _num(r.get("speedup"), 2)),
        ("slowdown per job (a)", lambda r: _num(r.get("slowdown"), 2)),
        ("device peak used MiB", lambda r: _num(r["device_peak_used_mib"])),
        ("host USS peak MiB", lambda r: _num(r["host_uss_peak_mib"])),
        ("wall s", lambda r: _num(r["wall_s"], 1)),
    ]
    for name, cell in rows:
        t.add_row(name, *(cell(run) for run in runs))
    t.caption = CAPTION
    t.caption_justify = "left"
    return t


CAPTION = (
    "(a) while all jobs ran (where '-', jobs ran in waves: over the whole span, and each job's "
    "epochs after the first). x one job: all jobs' samples/s over one job's alone; slowdown: "
    "how much slower each job (median) trained than one job alone. x one job ~ jobs / slowdown."
)


def failures(report: dict[str, Any]) -> list[str]:
    lines = []
    for run in report["runs"]:
        for job in run["jobs"]:
            if job["status"] != "ok":
                detail = " ".join(x.strip() for x in (job["detail"] or "").splitlines())
                lines.append(f"{run['label']} {job['label']}: {job['reason']}: {detail}")
    return lines


def _failed(run: dict[str, Any]) -> str:
    if not run["failed"]:
        return "0"
    reasons = ", ".join(f"{k} {v}" for k, v in sorted(run["reasons"].items()))
    return f"{run['failed']} ({reasons})"


def _at_once(run: dict[str, Any]) -> str:
    gate = run.get("host_gate")
    if not gate:
        return "-"
    waited = gate["jobs_that_waited"]
    return f"{gate['most_running']}" + (f" ({waited} waited: host memory)" if waited else "")


def _num(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"
