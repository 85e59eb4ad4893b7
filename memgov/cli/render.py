"""Rich tables for people (the CLI's --json path never imports rich)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from memgov._base.sizes import format_size

PLAIN_WIDTH = 4096
"""Without a terminal (CI logs, `| tee`, files) rich would wrap at 80 columns, splitting paths and
reasons mid-word: lines are then as long as their content instead."""


def console(stderr: bool = False) -> Console:
    """A rich Console for people: the terminal's width, or unwrapped plain text without one."""
    probe = Console(stderr=stderr)
    if probe.is_terminal:
        return probe
    return Console(stderr=stderr, width=PLAIN_WIDTH, soft_wrap=True, no_color=True, highlight=False)


def one_line(text: str | None) -> str:
    """A failure's whole detail on one line (a report line must not be cut)."""
    return " ".join(line.strip() for line in (text or "").splitlines() if line.strip())


def _holder(claim: dict[str, Any], here: str) -> str:
    """The holder's PID, with its host when that is not this one: PIDs inside containers repeat
    (every container's trainer is PID 7 or so), its hostname tells them apart."""
    host = claim.get("host")
    return f"{claim['pid']} @{host}" if host and host != here else str(claim["pid"])


def _text(value: object) -> str:
    """Other users' text (claim names, file names) made safe to show: control characters and
    other non-printable ones as escapes (no terminal sequences), rich markup escaped."""
    raw = str(value)
    safe = "".join(c if c.isprintable() else repr(c)[1:-1] for c in raw)
    return escape(safe)


def _uid(uid: object) -> str:
    """The record file's owner: who really holds it (a record's own pid and name are text its
    writer chose, and may name someone else's process)."""
    return "?" if uid is None else str(uid)


def status_table(data: dict[str, Any]) -> Table:
    import socket

    here = socket.gethostname()
    table = Table(title="memgov status", show_lines=False)
    for column in ("GPU", "claim", "pid", "uid", "budget", "sized", "use", "mode", "threads"):
        right = column in ("budget", "use", "pid", "uid", "threads")
        table.add_column(column, justify="right" if right else "left")
    for dev in data["devices"]:
        head = (
            f"[bold]{dev['index']}[/] {_text(dev['name'])}\n{_text(dev['uuid'])}\n"
            f"total {format_size(dev['total'])}  used {format_size(dev['used'])}\n"
            f"claimed {format_size(dev['claimed'])}  [green]free {format_size(dev['free'])}[/]"
        )
        if not dev["claims"]:
            table.add_row(head, "[dim](no claims)[/]", "", "", "", "", "", "", "")
        for i, c in enumerate(dev["claims"]):
            table.add_row(
                head if i == 0 else "",
                _text(c["name"]),
                _text(_holder(c, here)),
                _uid(c.get("uid")),
                format_size(c["bytes"]),
                _text(c.get("sized") or "-"),
                format_size(c["use"]),
                _text(c["mode"]),
                "-" if c.get("threads") is None else str(c["threads"]),
            )
        for q in dev["queue"]:
            table.add_row(
                "",
                f"[yellow]waiting[/] {_text(q['name'])}",
                str(q["pid"]),
                _uid(q.get("uid")),
                format_size(q["bytes"]),
                "",
                "",
                "queued",
                "",
            )
        for p in dev["problems"]:
            table.add_row("", f"[red]skipped[/] {_text(p)}", "", "", "", "", "", "", "")
        table.add_section()
    return table


def devices_table(found: list[dict[str, Any]]) -> Table:
    table = Table(title="memgov devices")
    for column in ("index", "uuid", "name", "total", "used", "visible as"):
        table.add_column(column)
    for d in found:
        seen = "-" if d["visible_index"] is None else f"cuda:{d['visible_index']}"
        table.add_row(
            str(d["index"]),
            d["uuid"],
            d["name"],
            format_size(d["total"]),
            format_size(d["used"]),
            seen,
        )
    return table
