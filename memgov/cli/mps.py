"""`memgov mps start | stop | status`: memgov's MPS control daemon (docs/hard-limits.md).

memgov._gpu.mps is imported inside each command, so `memgov --help` stays cheap.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from memgov.cli._common import JsonFlag, attempt

mps_app = typer.Typer(
    name="mps",
    help="Run an NVIDIA MPS control daemon so that claims become driver-enforced (hard mode).",
    no_args_is_help=True,
)

Timeout = Annotated[
    float, typer.Option("--timeout", min=0.5, help="Seconds to wait for the daemon.")
]


def _print(info: dict[str, Any], as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(info, indent=2, sort_keys=True))
    else:
        _show(info)


def _show(info: dict[str, Any]) -> None:
    for d in info.get("daemons") or [info]:
        state = "running" if d["running"] else "not running"
        typer.echo(
            f"MPS daemon {d.get('daemon', 0)}: {state} (pipe folder {d['pipe']}, "
            f"log folder {d['log']})"
        )
        if d["running"]:
            owner = "started by memgov" if d["started_by_memgov"] else "not started by memgov"
            typer.echo(f"  daemon pid {d['daemon_pid']}, {owner}")
            for server in d["servers"]:
                pids = " ".join(map(str, server["clients"])) or "none"
                typer.echo(
                    f"  server pid {server['pid']}: {len(server['clients'])} client(s): {pids}"
                )
    if info["binary"] is None:
        typer.echo("nvidia-cuda-mps-control: not on PATH (claims stay soft)")
    if info["running"]:
        running = info.get("running_daemons", 1)
        for uuid, count in info["clients_per_gpu"].items():
            typer.echo(
                f"{uuid}: {count} client(s) of at most {info['client_limit']} per daemon "
                f"x {running} daemon(s)"
            )
        typer.echo(
            f"hard claims pick a daemon with room (MEMGOV_MPS_POLICY={info['policy']}) "
            "and point CUDA_MPS_PIPE_DIRECTORY at it"
        )
    if info.get("default_daemon"):
        typer.echo("another MPS daemon answers at the system default /tmp/nvidia-mps")


@mps_app.command("start")
def start(
    as_json: JsonFlag = False,
    timeout: Timeout = 10.0,
    daemons: Annotated[
        int,
        typer.Option(
            "--daemons",
            min=1,
            max=16,
            help="Control daemons to run (each admits MEMGOV_MPS_CLIENTS clients per GPU, 48 "
            "by default); those not yet running are started.",
        ),
    ] = 1,
) -> None:
    """Start control daemons for the host's GPUs, with their folders under memgov's folder."""
    from memgov._gpu import mps as _mps

    info = attempt(lambda: _mps.start(timeout=timeout, daemons=daemons), OSError)
    _print(info, as_json)
    if not as_json:
        for k, seconds in sorted(info.get("start_s", {}).items()):
            typer.echo(f"started daemon {k} in {seconds:.3f} s")


@mps_app.command("status")
def status(as_json: JsonFlag = False) -> None:
    """Whether memgov's daemon answers, its servers and their client processes."""
    from memgov._gpu import mps as _mps

    _print(attempt(_mps.status, OSError), as_json)


@mps_app.command("stop")
def stop(
    as_json: JsonFlag = False,
    timeout: Timeout = 10.0,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Stop it even with clients connected (their GPU work ends) or not memgov's.",
        ),
    ] = False,
) -> None:
    """Stop memgov's daemons and their servers (quit, then SIGTERM/SIGKILL what is left)."""
    from memgov._gpu import mps as _mps

    report = attempt(lambda: _mps.stop(force=force, timeout=timeout), OSError)
    if as_json:
        typer.echo(json.dumps(report, indent=2, sort_keys=True))
    else:
        for line in report["actions"]:
            typer.echo(line)
        for proc in report["left"]:
            typer.echo(f"still running: {proc['name']} {proc['pid']}", err=True)
    if report["left"]:
        raise typer.Exit(1)
