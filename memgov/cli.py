"""The `memgov` command: a thin layer over the library (heavy imports happen inside commands)."""

from __future__ import annotations

import json
import sys
import time
from typing import Annotated, Any

import typer

from memgov._errors import MemgovError

app = typer.Typer(
    name="memgov",
    help="Share one NVIDIA GPU between many training processes.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

JsonFlag = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
DISTRIBUTION = "memgov-gpu"
"""The name pip knows memgov by (`memgov` on the public index is another project)."""


def _print_version(value: bool) -> None:
    if value:
        import os

        from memgov import __file__ as package_file
        from memgov import __version__

        where = os.path.dirname(package_file)
        typer.echo(f"memgov {__version__} (pip: {DISTRIBUTION}; {where}; Python "
                   f"{sys.version.split()[0]} at {sys.executable})")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[bool, typer.Option(
        "--version", callback=_print_version, is_eager=True,
        help="Print memgov's version, where it is installed, and exit.")] = False,
) -> None:
    """Share one NVIDIA GPU between many training processes."""


def _fail(exc: Exception) -> typer.Exit:
    typer.echo(f"memgov: {exc}", err=True)
    return typer.Exit(2)


def _print_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, sort_keys=True))


@app.command()
def status(
    as_json: JsonFlag = False,
    watch: Annotated[
        float | None,
        typer.Option("--watch", min=0.2, help="Refresh every SECONDS until Ctrl-C."),
    ] = None,
) -> None:
    """Per GPU: total, used (NVML), claimed, free budget, and every claim."""
    from memgov import _status

    try:
        if watch is None:
            data = _status.status()
            if as_json:
                _print_json(data)
            else:
                from memgov._render import console, status_table

                console().print(status_table(data))
                if not data["devices"]:
                    typer.echo(_no_gpu_hint())
            return
        _watch(watch, as_json)
    except MemgovError as exc:
        raise _fail(exc) from None


def _watch(seconds: float, as_json: bool) -> None:
    from rich.live import Live

    from memgov import _status
    from memgov._render import status_table

    try:
        if as_json:
            while True:
                typer.echo(json.dumps(_status.status(), sort_keys=True))
                time.sleep(seconds)
        with Live(status_table(_status.status()), auto_refresh=False) as live:
            while True:
                time.sleep(seconds)
                live.update(status_table(_status.status()), refresh=True)
    except KeyboardInterrupt:
        return


@app.command()
def gc(as_json: JsonFlag = False) -> None:
    """Remove the records of dead holders and say what was removed or skipped. Run by root, it is
    also the set-up of a ledger shared by several users: it makes every device's folders."""
    import os

    from memgov import _status

    try:
        snaps = _status.snapshots(clean=True, set_up=os.geteuid() == 0)
    except MemgovError as exc:
        raise _fail(exc) from None
    removed = [r for s in snaps for r in s.removed]
    problems = [p for s in snaps for p in s.problems]
    if as_json:
        _print_json({"removed": removed, "skipped": problems})
        return
    for line in removed:
        typer.echo(f"removed {line}")
    for line in problems:
        typer.echo(f"skipped {line}")
    typer.echo(f"{len(removed)} removed, {len(problems)} skipped")


@app.command()
def devices(as_json: JsonFlag = False) -> None:
    """The GPUs memgov sees (NVML, or simulated with MEMGOV_DEVICES)."""
    from memgov._devices import devices as list_devices
    from memgov._status import device_dict

    try:
        found = [device_dict(d) for d in list_devices()]
    except MemgovError as exc:
        raise _fail(exc) from None
    if as_json:
        _print_json({"devices": found})
        return
    from memgov._render import console, devices_table

    console().print(devices_table(found))
    if not found:
        typer.echo(_no_gpu_hint())


def _no_gpu_hint() -> str:
    from memgov._devices import no_gpu_hint

    return no_gpu_hint()


@app.command(context_settings={"allow_interspersed_args": False})
def run(
    command: Annotated[list[str], typer.Argument(help="The command, after --.")],
    claim: Annotated[
        str, typer.Option("--claim", help="SIZE (2GiB, 25%), growth, auto or off.")
    ] = "auto",
    device: Annotated[
        str | None, typer.Option("--device", help="Index (cuda:N), GPU UUID or auto.")
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
) -> None:
    """Run CMD governed by env alone: memgov run --claim 2GiB -- python train.py"""
    from memgov import _autoenable, _run

    try:
        env = _run.command_env(claim, device, wait, strict, threads)
        if not _autoenable.installed_pth():
            typer.echo(
                f"memgov: warning: {_autoenable.PTH_NAME} is not installed for {sys.executable}; "
                "CMD is governed only if its Python has memgov installed",
                err=True,
            )
        _run.exec_command(command, env)
    except MemgovError as exc:
        raise _fail(exc) from None


@app.command()
def doctor(as_json: JsonFlag = False) -> None:
    """What memgov sees: NVML, devices, frameworks, MPS, budgets and the ledger folder."""
    from memgov import _doctor

    report = _doctor.diagnose()
    if as_json:
        _print_json(report)
        return
    for line in _doctor.render(report):
        typer.echo(line)


def _add_mps() -> None:
    from memgov._cli_mps import mps_app  # `memgov mps start|stop|status`

    app.add_typer(mps_app, name="mps")


_add_mps()


def _add_pack() -> None:
    from memgov._cli_pack import HELP, pack  # `memgov pack` (docs/pack.md)

    app.command("pack", help=HELP)(pack)


_add_pack()


def _add_ray() -> None:
    from memgov._cli_ray import ray_app  # `memgov ray node-resources|status|pack` (docs/ray.md)

    app.add_typer(ray_app, name="ray")


_add_ray()


def main() -> None:
    try:
        app()
    except BrokenPipeError:  # `memgov status | head`
        sys.exit(0)


if __name__ == "__main__":
    main()
