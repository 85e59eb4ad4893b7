"""`memgov queue ...`: a job queue that places jobs on the host's GPUs by a policy (docs/queue.md),
and the cluster simulator (docs/placement.md).

- ``memgov queue [list] [--json]``: this user's jobs; ``add [--claim SIZE|auto] [--name N]
  [--gpu G] -- CMD ...`` (its folder and environment kept); ``cancel ID``; ``log ID``;
- ``memgov queue run [--policy P] [--out REPORT.json] [--solo REPORT.json] [--plot FILE] [FILE]``:
  a queue file (or every queued job) to the end, then the report; ``--ray ADDRESS`` runs the
  jobs as Ray tasks; ``memgov queue serve``: runs what is submitted until Ctrl-C;
- ``memgov queue simulate --trace FILE --nodes FILE --policy P``: replay a trace on a simulated
  cluster by the FGD paper's protocol (memgov/placement/simulate.py).

Thin: the engine is memgov.queue (imported in the commands). The placement library needs numpy,
imported in `simulate` only.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from memgov._base.errors import MemgovError
from memgov.cli._common import JsonFlag, attempt, fail, print_json

queue_app = typer.Typer(
    help="A job queue on the GPUs (add, list, cancel, log, run, serve); simulate a policy.",
    invoke_without_command=True,
    add_completion=False,
)

CURVE_POINTS = (10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110, 120, 130)
QUEUE_POLICIES = (
    "memgov (default), fifo, fifo-exclusive, sjf-exclusive, bestfit, tetris, gpupacking, fgd, "
    "random"
)
PolicyOption = Annotated[str | None, typer.Option("--policy", help=f"One of {QUEUE_POLICIES}.")]
MaxSlowdownOption = Annotated[
    float | None,
    typer.Option(
        "--max-slowdown",
        help="memgov's bound on each job's run time beside others over its solo time (>= 1.0).",
    ),
]
GraceOption = Annotated[
    float, typer.Option("--grace", help="Seconds between SIGTERM and SIGKILL when stopping jobs.")
]
JobId = Annotated[int, typer.Argument(help="The job's id (`memgov queue` lists them).")]
ADD_SETTINGS = {"allow_interspersed_args": False}
"""Options after CMD belong to CMD."""


@queue_app.callback()
def jobs(ctx: typer.Context, as_json: JsonFlag = False) -> None:
    """This user's queued, running and finished jobs (as `memgov queue list`)."""
    if ctx.invoked_subcommand is not None:
        ctx.obj = {"json": as_json}  # `memgov queue --json CMD`: CMD's output is JSON too
        return
    _list(as_json)


@queue_app.command("list")
def list_jobs(ctx: typer.Context, as_json: JsonFlag = False) -> None:
    """This user's queued, running and finished jobs."""
    _list(_json(ctx, as_json))


def _json(ctx: typer.Context, as_json: bool) -> bool:
    """--json after the command, or before it (the group's)."""
    return as_json or bool((ctx.obj or {}).get("json"))


def _list(as_json: bool) -> None:
    import memgov.queue as q

    found, problems = attempt(q.jobs)
    if as_json:
        print_json({"jobs": [j.to_json() | {"env": None} for j in found], "problems": problems})
        return
    for job in found:
        typer.echo(_job_line(job))
    for problem in problems:
        typer.echo(f"problem: {problem}", err=True)
    if not found and not problems:
        typer.echo("no jobs: memgov queue add -- CMD ..., or memgov queue run FILE")


def _job_line(job: Any) -> str:
    last = job.last
    from memgov._base.sizes import format_size

    claim = format_size(job.claim) if isinstance(job.claim, int) else str(job.claim)
    ran = f", last run {last.claim_bytes / 2**20:,.0f} MiB on gpu {last.gpu}" if last else ""
    result = last.result if last and job.state != "running" else None
    end = f" ({result})" if result and result != job.state else ""
    state = f"{job.state}{end}"
    ago = time.time() - job.created
    return f"{job.id:>5} {state:<16} {job.name[:40]:<40} claim {claim}{ran}; added {ago:,.0f} s ago"


@queue_app.command("add", context_settings=ADD_SETTINGS)
def add(
    ctx: typer.Context,
    command: Annotated[list[str], typer.Argument(help="The command, after --.")],
    claim: Annotated[str, typer.Option("--claim", help="SIZE (2GiB, 25%) or auto.")] = "auto",
    name: Annotated[str | None, typer.Option("--name", help="The job's name.")] = None,
    gpu: Annotated[int | None, typer.Option("--gpu", help="Pin to this GPU index.")] = None,
    kind: Annotated[str, typer.Option("--kind", help="A label grouping jobs.")] = "",
    duration: Annotated[
        float | None, typer.Option("--duration", help="Expected solo seconds (for SJF).")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Queue CMD (its folder and environment kept): memgov queue add -- python train.py"""
    as_json = _json(ctx, as_json)
    import memgov.queue as q
    from memgov.queue.queuefile import job_spec
    from memgov.queue.submit import check

    table: dict[str, Any] = {"cmd": command, "claim": claim}
    for key, value in (("name", name), ("gpu", gpu), ("duration", duration)):
        if value is not None:
            table[key] = value
    if kind:
        table["kind"] = kind
    try:
        spec = job_spec(table, "memgov queue add", Path(os.getcwd()))
        check([spec], dict(os.environ))
        (job,) = q.add([spec])
    except MemgovError as exc:
        raise fail(exc) from None
    if as_json:
        print_json({"id": job.id, "name": job.name, "job": job.job})
        return
    typer.echo(f"queued job {job.id} ({job.name}); `memgov queue serve` runs it")


@queue_app.command("cancel")
def cancel(ctx: typer.Context, job_id: JobId, as_json: JsonFlag = False) -> None:
    """Cancel a queued job or stop a running one."""
    as_json = _json(ctx, as_json)
    import memgov.queue as q

    said = attempt(lambda: q.cancel(job_id))
    if as_json:
        print_json({"id": job_id, "done": said})
        return
    typer.echo(said)


@queue_app.command("log")
def log(
    ctx: typer.Context,
    job_id: JobId,
    tail: Annotated[int, typer.Option("--tail", help="Bytes from the end.")] = 64 * 1024,
    as_json: JsonFlag = False,
) -> None:
    """A job's output (every attempt)."""
    as_json = _json(ctx, as_json)
    from memgov.queue.store import Store

    try:
        store = Store()
        store.get(job_id)  # a clear error for an id that is not in this user's queue
        data, size = store.read_log(job_id, max(1, tail))
    except MemgovError as exc:
        raise fail(exc) from None
    text = data.decode(errors="replace")
    if as_json:
        print_json({"id": job_id, "bytes": size, "log": text})
        return
    typer.echo(text, nl=False)


@queue_app.command("run")
def run(
    ctx: typer.Context,
    file: Annotated[
        Path | None, typer.Argument(help="A queue file (TOML); none: every queued job.")
    ] = None,
    policy: PolicyOption = None,
    max_slowdown: MaxSlowdownOption = None,
    out: Annotated[Path | None, typer.Option("--out", help="Write the report (JSON) here.")] = None,
    solo: Annotated[
        Path | None, typer.Option("--solo", help="An exclusive run's report: solo times.")
    ] = None,
    plot: Annotated[Path | None, typer.Option("--plot", help="Draw the run (matplotlib).")] = None,
    ray: Annotated[
        str | None, typer.Option("--ray", help="Run the jobs as Ray tasks on this cluster.")
    ] = None,
    grace: GraceOption = 10.0,
    as_json: JsonFlag = False,
) -> None:
    """Run a queue file (or every queued job) to the end; print the report."""
    as_json = _json(ctx, as_json)
    import memgov.queue as q

    try:
        _can_finish(out, plot, ray)
        if ray is not None:
            from memgov.queue.onray import run_on_ray

            report = run_on_ray(file, ray, policy=policy, solo=solo, max_slowdown=max_slowdown)
        else:
            report = q.run(file, policy, solo=solo, grace_s=grace, max_slowdown=max_slowdown)
    except MemgovError as exc:
        raise fail(exc) from None
    except KeyboardInterrupt:  # Ctrl-C before the runner's own handlers (e.g. joining Ray)
        raise typer.Exit(130) from None
    data = report.to_json()
    try:
        if out is not None:
            report.write(out)
        if plot is not None:
            from memgov.queue.report import plot as draw

            draw(data, plot)
    except (OSError, MemgovError) as exc:  # the folder went away during the run: show it all
        _show(data, as_json, exit_after=False)
        typer.echo(f"memgov: the report was not written: {exc}", err=True)
        raise typer.Exit(1) from None
    _show(data, as_json)


def _can_finish(out: Path | None, plot: Path | None, ray: str | None) -> None:
    """What the run's end needs is here: said before any job runs, not after them all."""
    for option, path in (("--out", out), ("--plot", plot)):
        if path is not None:
            _writable(option, path)
    if plot is not None:
        from memgov.queue.report import pyplot

        pyplot()
    if ray is not None:
        try:
            import ray as _ray  # noqa: F401
        except ImportError as exc:
            from memgov._base.errors import ConfigError
            from memgov.cli.ray import RAY_INSTALL

            raise ConfigError(
                f"--ray needs Ray, which cannot be imported here ({exc}): {RAY_INSTALL}"
            ) from None


def _writable(option: str, path: Path) -> None:
    """An output file can be written where it is asked for: said before any job runs."""
    from memgov._base.errors import ConfigError

    accepted = "accepted a file path in a folder that exists and you can write"
    if path.is_dir():
        raise ConfigError(f"{option} {path}: a folder; {accepted}")
    if not path.parent.is_dir():
        raise ConfigError(f"{option} {path}: no folder {path.parent}; {accepted}")
    if not os.access(path.parent, os.W_OK | os.X_OK):
        raise ConfigError(f"{option} {path}: folder {path.parent} is not writable; {accepted}")


@queue_app.command("serve")
def serve(
    ctx: typer.Context,
    policy: PolicyOption = None,
    max_slowdown: MaxSlowdownOption = None,
    grace: GraceOption = 10.0,
    as_json: JsonFlag = False,
) -> None:
    """Run what is submitted (`memgov queue add`) until Ctrl-C or SIGTERM: a line as each job
    starts and ends (--json: one JSON object a line, the report the last one)."""
    as_json = _json(ctx, as_json)
    import json

    import memgov.queue as q

    def tell(event: dict[str, Any]) -> None:
        typer.echo(json.dumps(event, sort_keys=True) if as_json else _event_line(event))

    report = attempt(lambda: q.serve(policy, grace_s=grace, tell=tell, max_slowdown=max_slowdown))
    data = report.to_json()
    if not as_json:
        _show(data, as_json)
    typer.echo(json.dumps(data, sort_keys=True))  # JSON lines: the report is the last one
    _exit_for(data)


def _event_line(event: dict[str, Any]) -> str:
    from memgov._base.sizes import format_size

    kind = event["event"]
    if kind == "serving":
        gpus = ", ".join(f"gpu {g['gpu']} {format_size(g['total_bytes'])}" for g in event["gpus"])
        return (
            f"serving the queue: policy {event['policy']} on {gpus}; "
            "`memgov queue add -- CMD` queues a job, Ctrl-C stops"
        )
    job = f"job {event['id']} ({event['name']})"
    if kind == "never":
        return f"never: {job}: {event.get('detail', '')}"
    where = f"gpu {event['gpu']}, {format_size(event['claim_bytes'])}, attempt {event['attempt']}"
    if kind in ("start", "adopt"):
        verb = "started" if kind == "start" else "running (adopted)"
        return f"{verb}: {job} on {where}"
    ran = f" after {event['run_s']:,.1f} s" if event.get("run_s") is not None else ""
    detail = f": {event['detail']}" if event.get("detail") else ""
    return f"ended {event['result']}: {job} on {where}{ran}{detail}"


def _show(data: dict[str, Any], as_json: bool, exit_after: bool = True) -> None:
    from memgov.queue.report import table

    if as_json:
        print_json(data)
    else:
        typer.echo(table(data))
    if exit_after:
        _exit_for(data)


def _exit_for(data: dict[str, Any]) -> None:
    if data.get("interrupted"):
        raise typer.Exit(128 + int(data["interrupted"]))  # its unfinished jobs queued again
    if any(j["end"] != "ok" for j in data["jobs"]):
        raise typer.Exit(1)


@queue_app.command("simulate")
def simulate(
    ctx: typer.Context,
    trace: Annotated[Path, typer.Option(help="Jobs CSV (Alibaba cluster-trace-gpu-v2023 layout).")],
    nodes: Annotated[Path, typer.Option(help="Nodes CSV (sn,cpu_milli,memory_mib,gpu,model).")],
    policy: Annotated[str, typer.Option(help=f"One of {QUEUE_POLICIES}.")] = "memgov",
    seed: Annotated[
        int, typer.Option(min=0, help="Seed of the arrival order and inflation (>= 0).")
    ] = 42,
    as_json: JsonFlag = False,
) -> None:
    """Replay a trace on a simulated cluster; print the allocation curve and final GPU share."""
    as_json = _json(ctx, as_json)
    try:
        from memgov.decide import get as get_policy
        from memgov.placement import load_nodes, load_trace, simulate as run_simulation
    except ImportError as exc:
        raise fail(
            RuntimeError(
                f"memgov queue simulate needs numpy ({exc}); pip install 'memgov-gpu[placement]'"
            )
        ) from None
    try:
        chosen = get_policy(policy)  # a bad name is refused before the files are read
        result = run_simulation(load_trace(trace), load_nodes(nodes), chosen, seed)
    except MemgovError as exc:
        raise fail(exc) from None
    if as_json:
        print_json(result.to_json())
        return
    typer.echo(
        f"policy {result.policy}, seed {result.seed}: {result.arrived} jobs arrived, "
        f"{result.placed} placed, {result.failed} failed, on {result.total_gpus} GPUs "
        f"({result.seconds:.1f} s)"
    )
    typer.echo("arrived % of GPUs -> allocated %")
    for point in CURVE_POINTS:
        if point in result.curve:
            typer.echo(f"  {point:4d} -> {result.curve[point]:6.2f}")
    typer.echo(f"final allocation: {result.final_percent:.2f} % of GPU milli")
