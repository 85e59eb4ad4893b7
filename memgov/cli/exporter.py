"""`memgov exporter`: the ledger and NVML as Prometheus metrics (memgov.exporter does the work).

Needs the optional extra: ``pip install 'memgov-gpu[exporter]'`` (prometheus_client); without it
the command says so in one line and exits 2. docs/metrics.md lists the metrics.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from memgov._base.errors import MemgovError
from memgov.cli._common import fail
from memgov.exporter import DEFAULT_LISTEN, DEFAULT_PORT

HELP = (
    "Serve memgov's metrics for Prometheus on /metrics (default port "
    f"{DEFAULT_PORT}), or write them for node_exporter's textfile collector (--textfile)."
)


def exporter(
    listen: Annotated[
        str,
        typer.Option(
            "--listen",
            metavar="HOST:PORT",
            help="Where to answer /metrics: HOST:PORT, [IPV6]:PORT, :PORT (every interface: "
            "anyone who reaches the port sees every user's claims) or PORT (loopback only). "
            f"Default {DEFAULT_LISTEN}.",
        ),
    ] = DEFAULT_LISTEN,
    textfile: Annotated[
        Path | None,
        typer.Option(
            "--textfile",
            metavar="DIR",
            help="Instead of serving, write DIR/memgov.prom (atomically) for node_exporter's "
            "--collector.textfile.directory, every --interval seconds.",
        ),
    ] = None,
    interval: Annotated[
        float, typer.Option("--interval", min=1.0, help="Seconds between textfile writes.")
    ] = 15.0,
    refresh: Annotated[
        float,
        typer.Option(
            "--refresh",
            min=0.1,
            metavar="SECONDS",
            help="Seconds between refreshes of the served body when nothing changes; a new or "
            "removed record, or a holder's death, refreshes it at once. Default 5.",
        ),
    ] = 5.0,
    release_nvml: Annotated[
        bool,
        typer.Option(
            "--release-nvml",
            help="Shut NVML down after each refresh: its state is not kept in memory between "
            "refreshes, and each refresh initialises NVML again (docs/metrics.md, Memory).",
        ),
    ] = False,
    once: Annotated[
        bool,
        typer.Option(
            "--once", help="With --textfile: write once and exit (for a cron job or timer)."
        ),
    ] = False,
) -> None:
    """Serve memgov's metrics for Prometheus (docs/metrics.md)."""
    from memgov.exporter import exec_server, require_prometheus_client

    try:
        require_prometheus_client()
        from memgov.exporter import serve

        if textfile is None:
            if once:
                raise typer.BadParameter("--once needs --textfile DIR")
            serve.parse_listen(listen)  # said here, before the serving process replaces this
            exec_server(listen, refresh, release_nvml)
        elif once:
            if release_nvml:  # one write, then the process ends: nothing stays to release
                raise typer.BadParameter("--release-nvml is for a server or a --textfile loop")
            typer.echo(serve.write_textfile(textfile))
        else:
            serve.textfile_loop(textfile, interval, release_nvml=release_nvml)
    except MemgovError as exc:
        raise fail(exc) from None
