"""The `memgov` command: a thin layer over the library (heavy imports happen inside commands).

typer's layout, one module per command group: status.py (status, gc, devices), run.py, doctor.py,
profiles.py, mps.py, pack.py (with progress.py), ray.py, exporter.py, queue.py; render.py holds the
rich tables they share. This file makes the app, its global options (--version) and `main`, the
entry point (`memgov = "memgov.cli:main"`). The library never imports this package.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from memgov.cli import doctor, exporter, mps, pack, profiles, queue, ray, run, status

app = typer.Typer(
    name="memgov",
    help="Share one NVIDIA GPU between many training processes.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

DISTRIBUTION = "memgov-gpu"
"""The name pip knows memgov by (`memgov` on the public index is another project)."""


def _print_version(value: bool) -> None:
    if value:
        import os

        from memgov import __file__ as package_file, __version__

        where = os.path.dirname(package_file)
        typer.echo(
            f"memgov {__version__} (pip: {DISTRIBUTION}; {where}; Python "
            f"{sys.version.split()[0]} at {sys.executable})"
        )
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_print_version,
            is_eager=True,
            help="Print memgov's version, where it is installed, and exit.",
        ),
    ] = False,
) -> None:
    """Share one NVIDIA GPU between many training processes."""


# In this order in `memgov --help`.
app.command("status")(status.status)
app.command("gc")(status.gc)
app.command("devices")(status.devices)
app.command("run", context_settings=run.RUN_SETTINGS)(run.run)
app.command("doctor")(doctor.doctor)
app.add_typer(profiles.profiles_app, name="profiles")  # `memgov profiles` (docs/profiles.md)
app.add_typer(mps.mps_app, name="mps")  # `memgov mps start|stop|status` (docs/hard-limits.md)
app.command("pack", help=pack.HELP)(pack.pack)  # `memgov pack` (docs/pack.md)
app.add_typer(ray.ray_app, name="ray")  # `memgov ray node-resources|status|pack` (docs/ray.md)
app.command("exporter", help=exporter.HELP)(exporter.exporter)  # Prometheus (docs/metrics.md)
app.add_typer(queue.queue_app, name="queue")  # `memgov queue` (docs/queue.md, docs/placement.md)


REQUIRED = ("numpy", "psutil", "filelock")
"""memgov's own dependencies that a command imports on use (pyproject.toml)."""


def main() -> None:
    try:
        app()
    except BrokenPipeError:  # `memgov status | head`
        sys.exit(0)
    except ModuleNotFoundError as exc:  # an environment that lost a dependency of memgov's
        if exc.name not in REQUIRED:
            raise
        print(
            f"memgov: {exc.name} is missing, a dependency of memgov-gpu: pip install {exc.name}",
            file=sys.stderr,
        )
        sys.exit(1)


__all__ = ["app", "main"]
