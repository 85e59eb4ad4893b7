"""`memgov run -- CMD`: run a command governed by its environment alone (docs/auto-enable.md)."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from memgov._base.errors import MemgovError
from memgov.cli._common import fail

RUN_SETTINGS = {"allow_interspersed_args": False}
"""Options after CMD belong to CMD: `memgov run -- python train.py --claim x` passes --claim on."""


def run(
    command: Annotated[list[str], typer.Argument(help="The command, after --.")],
    claim: Annotated[
        str, typer.Option("--claim", help="SIZE (2GiB, 25%), growth, auto (measured) or off.")
    ] = "auto",
    gpu: Annotated[
        str | None, typer.Option("--gpu", help="Index (cuda:N), GPU UUID or auto.")
    ] = None,
    device: Annotated[
        str | None, typer.Option("--device", hidden=True, help="The old name of --gpu.")
    ] = None,
    wait: Annotated[
        float | None, typer.Option("--wait", help="Queue up to SECONDS for the budget.")
    ] = None,
    strict: Annotated[
        bool, typer.Option("--strict", help="Fail instead of warning when memgov cannot govern.")
    ] = False,
    threads: Annotated[
        int | None, typer.Option("--threads", help="CPU threads for the command's frameworks.")
    ] = None,
    job: Annotated[
        str | None,
        typer.Option("--job", help="The job's name for its profile (default: from the command)."),
    ] = None,
) -> None:
    """Run CMD governed by env alone: memgov run --claim 2GiB -- python train.py"""
    from memgov import _autoenable, _run

    if device is not None:  # one name for the GPU in every command (pack, queue add: --gpu)
        typer.echo("memgov: --device is now --gpu (the old name works for this release)", err=True)
        gpu = gpu if gpu is not None else device
    try:
        env = _run.command_env(claim, gpu, wait, strict, threads, job=job)
        if not _autoenable.installed_pth():
            typer.echo(
                f"memgov: warning: {_autoenable.PTH_NAME} is not installed for {sys.executable}; "
                "CMD is governed only if its Python has memgov installed",
                err=True,
            )
        _run.exec_command(command, env)
    except MemgovError as exc:
        raise fail(exc) from None
