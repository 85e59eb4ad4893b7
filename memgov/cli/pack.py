"""`memgov pack`: a thin layer over memgov.pack (docs/pack.md); heavy imports inside the command.

Exit status: 0 when every job finished, 1 when some failed (the report says why), 2 for a request
pack cannot run (nothing started), 130 (or 128 + signal) when interrupted; a partial report is
written in every case where jobs ran.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from memgov._base.errors import MemgovError
from memgov.cli._packoptions import command, own

HELP = """Run N copies of an experiment on one GPU, governed, and report footprints and speed.

EXPERIMENT is a folder with an experiment.toml (e.g. experiments/mnist). Arguments after `--` go
to every job's trainer, e.g. `memgov pack --n 25 experiments/mnist -- --limit 20000`.
Fast by default: each job gets its share of CPU threads, and MPS runs when the machine has it.
"""


def pack(
    *,
    experiment: str,
    trainer_args: list[str] | None,
    progress: bool,
    as_json: bool,
    **options: Any,
) -> None:
    from memgov.cli._packoptions import config
    from memgov.cli.progress import PackProgress
    from memgov.pack import run

    try:
        cfg = config("pack", options, experiment=experiment, trainer_args=list(trainer_args or []))
        observer = PackProgress() if progress else None
        try:
            outcome = run(cfg, observer)
        finally:
            if observer is not None:
                observer.close()
    except MemgovError as exc:  # ConfigError is a ValueError too
        typer.echo(f"memgov pack: {exc}", err=True)
        raise typer.Exit(2) from None
    except OSError as exc:  # said plainly, not as "[Errno N] ..."
        where = f"{exc.filename}: " if exc.filename else ""
        typer.echo(f"memgov pack: {where}{exc.strerror or exc}", err=True)
        raise typer.Exit(2) from None
    report = outcome.report
    if as_json:
        typer.echo(json.dumps(report, indent=1))
    else:
        _summary(report)
    if outcome.interrupted is not None:
        code = outcome.interrupted.code if isinstance(outcome.interrupted, SystemExit) else 130
        typer.echo(f"memgov pack: interrupted; partial report in {report['out']}", err=True)
        raise typer.Exit(code if isinstance(code, int) else 130)
    failed = sum(r["failed"] for r in report["runs"] if r["role"] == "main")
    raise typer.Exit(1 if failed else 0)


command(
    pack,
    "pack",
    [
        own(
            "experiment",
            Annotated[str, typer.Argument(help="Experiment folder or its experiment.toml.")],
        ),
        own(
            "trainer_args",
            Annotated[list[str] | None, typer.Argument(help="Extra trainer arguments (after --).")],
            None,
        ),
    ],
    [
        own("progress", Annotated[bool, typer.Option(help="Live progress on stderr.")], True),
        own(
            "as_json",
            Annotated[bool, typer.Option("--json", help="Print report.json on stdout.")],
            False,
        ),
    ],
)


def _summary(report: dict[str, Any]) -> None:
    from memgov.cli.render import console as make_console
    from memgov.pack import report as reports

    console = make_console()
    console.print(reports.table(report))
    from rich.markup import escape

    for line in reports.failures(report):
        console.print(f"[red]failed[/red] {escape(line)}", highlight=False)
    for note in report.get("notes") or []:
        console.print(f"note: {note}", highlight=False, markup=False)
    for run in report.get("runs") or []:
        if run.get("connections"):
            console.print(
                f"note: {run['label']}: {run['connections']}", highlight=False, markup=False
            )
        gate = run.get("host_gate") or {}
        if gate.get("jobs_that_waited"):
            console.print(
                f"note: {run['label']}: {gate['jobs_that_waited']} job(s) waited for host memory"
                f" (~{gate['per_job_mib']:,.0f} MiB each: {gate['source']}; "
                f"{gate['reserve_mib']:,.0f} MiB kept free); --host-per-job sets the estimate",
                highlight=False,
                markup=False,
            )
    files = report.get("files", {})
    console.print(
        f"report: {files.get('json')}  csv: {files.get('csv')}  "
        f"plot: {files.get('plot') or files.get('plot_error')}",
        highlight=False,
        markup=False,
    )  # paths and the install hint's [plots] are text, not markup
