"""`memgov profiles [show JOB | forget JOB] [--json]`: each job's measured peaks
(docs/profiles.md)."""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer

from memgov._base.errors import MemgovError
from memgov._ledger.parse import printable
from memgov.cli._common import JsonFlag, attempt, fail, print_json

profiles_app = typer.Typer(
    help="Measured peaks per job, which size `auto` claims: list, show one, forget one.",
    add_completion=False,
    invoke_without_command=True,
)

JobArg = Annotated[str, typer.Argument(help="The job's name (as `memgov profiles` lists it).")]


@profiles_app.callback()
def listing(ctx: typer.Context, as_json: JsonFlag = False) -> None:
    """Every job of yours with a profile: runs, largest peak, and what `auto` would claim."""
    if ctx.invoked_subcommand is not None:
        return
    from memgov._profiles import store as _profiles

    found, problems = attempt(_profiles.every)
    rows = [summary(p) for p in found]
    if as_json:
        print_json({"profiles": rows, "problems": problems})
        return
    for row in rows:
        typer.echo(
            f"{row['job']}  {row['runs']} run(s), peak {_mib(row['peak'])}, "
            f"last {row['last_end'] or '-'} {_ago(row['updated'])}; auto: {row['auto']}"
        )
        if row["command"]:  # what tells apart the jobs of one label (train.py-<hash>)
            typer.echo(f"  command: {printable(row['command'])}")
    for problem in problems:
        typer.echo(f"problem: {problem}")
    if not rows and not problems:
        typer.echo("no profiles yet: every governed run records one (docs/profiles.md)")


@profiles_app.command("show")
def show(job: JobArg, as_json: JsonFlag = False) -> None:
    """One job's runs: peak, how each ended, its claim and where that came from."""
    from memgov._profiles import store as _profiles

    profile = attempt(lambda: _profiles.read(job))
    if profile is None:
        raise fail(MemgovError(f"no profile for job {job!r} (`memgov profiles` lists them)"))
    data = {**summary(profile), "history": profile.runs}
    if as_json:
        print_json(data)
        return
    typer.echo(f"job {profile.job} ({profile.label}): auto: {data['auto']}")
    if profile.command:
        typer.echo(f"  command: {printable(profile.command)}")
    for run in profile.runs:
        typer.echo(
            f"  {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(run['time']))}  "
            f"peak {_mib(run.get('peak'))} ({run.get('measure') or '-'}), "
            f"claim {_mib(run.get('claim'))} ({run.get('sized') or '-'}), "
            f"ended: {run['end']}"
        )


@profiles_app.command("forget")
def forget(job: JobArg, as_json: JsonFlag = False) -> None:
    """Remove a job's profile: its next `auto` claim is a first run again."""
    from memgov._profiles import store as _profiles

    removed = attempt(lambda: _profiles.forget(job))
    if as_json:
        print_json({"job": job, "removed": removed})
        return
    if not removed:
        raise fail(MemgovError(f"no profile for job {job!r} (`memgov profiles` lists them)"))
    typer.echo(f"forgot {job}")


def summary(profile: Any) -> dict[str, Any]:
    """A profile's figures, as `memgov profiles --json` prints them (stable keys)."""
    from memgov._base.sizes import format_size
    from memgov._profiles import autosize as _autosize

    peaks = [r["peak"] for r in profile.runs if r.get("peak")]
    # What `auto` claims from these runs: on a real GPU, or (runs on simulated GPUs only) there.
    simulated = not _autosize.need(profile, simulated=False)
    found = _autosize.need(profile, simulated=simulated)
    return {
        "job": profile.job,
        "label": profile.label,
        "command": profile.command,
        "runs": len(profile.runs),
        "peak": max(peaks, default=None),
        "last_end": profile.runs[-1]["end"] if profile.runs else None,
        "updated": profile.updated,
        "auto_bytes": found[0] if found else None,
        "auto": f"{format_size(found[0])} = {found[1]}" if found else "a first run (no peak)",
        "measured_on": None if not found else "simulated GPU" if simulated else "GPU",
    }


def _mib(size: int | None) -> str:
    return "-" if not size else f"{size / 2**20:,.0f} MiB"


def _ago(when: float) -> str:
    seconds = max(0, time.time() - when)
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.0f} h ago"
