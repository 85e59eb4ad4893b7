"""Rich tables for people (the CLI's --json path never imports rich)."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from memgov._sizes import format_size


def status_table(data: dict[str, Any]) -> Table:
    table = Table(title="memgov status", show_lines=False)
    for column in ("GPU", "claim", "pid", "budget", "use", "mode", "threads"):
        right = column in ("budget", "use", "pid", "threads")
        table.add_column(column, justify="right" if right else "left")
    for dev in data["devices"]:
        head = (
            f"[bold]{dev['index']}[/] {dev['name']}\n{dev['uuid']}\n"
            f"total {format_size(dev['total'])}  used {format_size(dev['used'])}\n"
            f"claimed {format_size(dev['claimed'])}  [green]free {format_size(dev['free'])}[/]"
        )
        if not dev["claims"]:
            table.add_row(head, "[dim](no claims)[/]", "", "", "", "", "")
        for i, c in enumerate(dev["claims"]):
            table.add_row(
                head if i == 0 else "",
                c["name"],
                str(c["pid"]),
                format_size(c["bytes"]),
                format_size(c["use"]),
                c["mode"],
                "-" if c.get("threads") is None else str(c["threads"]),
            )
        for q in dev["queue"]:
            table.add_row("", f"[yellow]waiting[/] {q['name']}", str(q["pid"]),
                          format_size(q["bytes"]), "", "queued", "")
        for p in dev["problems"]:
            table.add_row("", f"[red]skipped[/] {p}", "", "", "", "", "")
        table.add_section()
    return table


def devices_table(found: list[dict[str, Any]]) -> Table:
    table = Table(title="memgov devices")
    for column in ("index", "uuid", "name", "total", "used", "visible as"):
        table.add_column(column)
    for d in found:
        seen = "-" if d["visible_index"] is None else f"cuda:{d['visible_index']}"
        table.add_row(str(d["index"]), d["uuid"], d["name"], format_size(d["total"]),
                      format_size(d["used"]), seen)
    return table
