"""`memgov doctor`: what memgov sees. The library gathers the report (memgov._doctor.diagnose);
this module prints it, as JSON or as one plain line per fact."""

from __future__ import annotations

from typing import Any

import typer

from memgov._base.sizes import format_size
from memgov._ledger.parse import printable
from memgov.cli._common import JsonFlag, print_json


def doctor(as_json: JsonFlag = False) -> None:
    """What memgov sees: NVML, devices, frameworks, MPS, budgets and the ledger folder."""
    from memgov import _doctor

    report = _doctor.diagnose()
    if as_json:
        print_json(report)
    else:
        for line in render(report):
            typer.echo(line)
    if report.get("ledger_problem"):
        raise typer.Exit(1)  # claims cannot use the ledger: say so in the exit status too


def render(report: dict[str, Any]) -> list[str]:
    """The report of memgov._doctor.diagnose() as plain lines, one fact each (grep-able)."""
    lines = [f"memgov {report['memgov']} ({report['python']})"]
    auto = report["auto_enable"]
    pth = ", ".join(auto["installed"]) or "NOT installed (reinstall memgov with pip)"
    lines.append(f"auto-enable: {pth}; {'triggered' if auto['triggered'] else 'not triggered'}")
    lines.append(f"NVML: {report['nvml']['note']}")
    for d in report["devices"]:
        where = "hidden" if d["visible_index"] is None else f"cuda:{d['visible_index']}"
        lines.append(
            f"device {d['uuid']} ({d['name']}, {where}): {format_size(d['total'])} total, "
            f"{format_size(d['used'])} used"
        )
    if report["devices_problem"]:
        lines.append(f"devices: {report['devices_problem']}")
    if not report["devices"]:
        from memgov._gpu.devices import no_gpu_hint

        lines.append(f"hint: {no_gpu_hint()}")
    fw = report["frameworks"]
    installed = ", ".join(f"{k} {v}" for k, v in fw["installed"].items()) or "none"
    lines.append(f"frameworks: {installed}; adapters: {', '.join(fw['adapters']) or 'none'}")
    lines.extend(f"adapter problem: {p}" for p in fw["adapter_problems"])
    mps = report["mps"]
    lines.append(
        f"MPS: server {'running' if mps['server_running'] else 'not running'} "
        f"(pipe {mps['pipe_directory']}), control binary "
        f"{mps['control_binary'] or 'not on PATH'}"
    )
    if "problem" in mps:
        lines.append(f"MPS settings: {mps['problem']}")
    else:
        contexts = mps["contexts_per_gpu"]
        lines.append(
            f"MPS: {mps['clients_per_daemon']} clients per daemon per GPU (MEMGOV_MPS_CLIENTS; "
            f"48 measured on the H200), {len(mps['memgov_daemons'])} memgov daemon(s) running, "
            f"policy {mps['policy']} (MEMGOV_MPS_POLICY); without MPS at most "
            f"{contexts if contexts is not None else 'unlimited'} claims per GPU "
            "(MEMGOV_CONTEXTS: CUDA contexts)"
        )
    budget = report["budget"]
    for b in budget["scheduler"]:
        lines.append(
            f"scheduler budget: {b['source']} -> {format_size(b['budget'])}"
            + (" (enforced limit, margin kept)" if b["enforced"] else "")
        )
    lines.extend(f"scheduler problem: {p}" for p in budget["problems"])
    lines.append(f"budget: {budget['decision']}")
    ledger = report["ledger"]
    lines.append(f"ledger: {ledger['path']}: {ledger['note']}")
    if ledger.get("flood_note"):
        lines.append(f"ledger: {ledger['flood_note']}")
    if report.get("ledger_problem"):
        lines.append(f"ledger PROBLEM: {report['ledger_problem']}")
    threads = report["threads"]
    lines.append(f"CPU threads: {threads['decision']}")
    for p in threads.get("governed", []):
        # Every field but the pid is text the record's writer chose: shown with escapes.
        lines.append(
            f"  governed pid {p['pid']} ({printable(str(p['host']))}): {p['threads']} "
            "thread(s): "
            + printable(str(p["why"] or p["source"]))
            + (f"; claim {printable(str(p['claim']))}" if p["claim"] else "")
        )
    lines.extend(report["views"])
    settings = report["settings"]
    lines.extend(f"setting problem: {row['problem']}" for row in settings if row["problem"])
    unset = [row["name"] for row in settings if row["source"] == "default" and not row["internal"]]
    lines.append(
        f"settings at their defaults: {', '.join(unset) or 'none'} (docs/auto-enable.md lists them)"
    )
    for key, value in report["environment"].items():
        lines.append(f"env {key}={value}")
    for key, item in report["environment_set_by_memgov"].items():
        lines.append(f"env {key}={item['value']} (set by memgov: {item['why']})")
    return lines
