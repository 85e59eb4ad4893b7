"""`memgov pack`: a thin layer over memgov.pack (docs/pack.md); heavy imports inside the command.

Exit status: 0 when every job finished, 1 when some failed (the report says why), 2 for a request
pack cannot run (nothing started), 130 (or 128 + signal) when interrupted; a partial report is
written in every case where jobs ran.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from memgov._errors import MemgovError

HELP = """Run N copies of an experiment on one GPU, governed, and report footprints and speed.

EXPERIMENT is a folder with an experiment.toml (e.g. experiments/mnist). Arguments after `--` go
to every job's trainer, e.g. `memgov pack --n 25 experiments/mnist -- --limit 20000`.
Fast by default: each job gets its share of CPU threads, and MPS runs when the machine has it.
"""


def pack(
    experiment: Annotated[str, typer.Argument(help="Experiment folder or its experiment.toml.")],
    trainer_args: Annotated[
        list[str] | None, typer.Argument(help="Extra trainer arguments (after --).")
    ] = None,
    n: Annotated[int, typer.Option("--n", "-n", help="Jobs to pack.")] = 2,
    framework: Annotated[str, typer.Option(help="torch, tensorflow or jax (the manifest's).")
                         ] = "torch",
    mode: Annotated[str, typer.Option(
        help="greedy (framework defaults: the study), growth, or claim (a budget per job).")
    ] = "claim",
    claim: Annotated[str, typer.Option(
        help="Budget per job in claim mode: a size (1GiB, 900MiB) or auto (measured peak "
             "+ margin; a default without history).")] = "auto",
    mps: Annotated[str, typer.Option(help="auto (when the machine has MPS), on, off.")] = "auto",
    mps_daemons: Annotated[int | None, typer.Option(
        help="MPS control daemons (each admits MEMGOV_MPS_CLIENTS clients per GPU, 48 by "
             "default); default: as many as the jobs at once need.")] = None,
    epochs: Annotated[int | None, typer.Option(help="Epochs per job (manifest default).")
                      ] = None,
    batch: Annotated[int | None, typer.Option(help="Batch size (manifest default).")] = None,
    runner: Annotated[str, typer.Option(help="auto (process, or preload when the jobs at once "
                                             "would not fit the host's memory as processes), "
                                             "process, namespace (own PID namespace; root), "
                                             "docker, or preload (jobs forked from one process "
                                             "that imported the framework once: less host "
                                             "memory and start-up CPU per job).")] = "auto",
    image: Annotated[str, typer.Option(help="Image for --runner docker (examples/docker).")
                     ] = "memgov-mnist",
    sweep: Annotated[str | None, typer.Option(
        help="Several job counts, e.g. 1,8,25: one run each, plotted against N.")] = None,
    out: Annotated[Path | None, typer.Option(help="Report folder (default pack-results/...).")
                   ] = None,
    device: Annotated[str, typer.Option(help="gpu, or cpu (a small run for CI and laptops: "
                                             "a simulated GPU for the ledger).")] = "gpu",
    gpu: Annotated[str | None, typer.Option(help="Which GPU: index or UUID (default: first).")
                   ] = None,
    threads: Annotated[str, typer.Option(
        help="CPU threads per job: auto (cores / jobs at once) or a number.")] = "auto",
    parallel: Annotated[int | None, typer.Option(
        help="Jobs at once (default all that the GPU's client or context limit takes; the "
             "rest queue).")
    ] = None,
    baseline: Annotated[str, typer.Option(
        help="naive: first run the same N greedy (no thread or MPS governance), side by side.")
    ] = "none",
    baseline_args: Annotated[str, typer.Option(
        help="Extra trainer arguments for the baseline only, e.g. '--limit 2000'.")] = "",
    solo: Annotated[bool, typer.Option(help="Run one job alone first (slowdown, speedup).")
                    ] = True,
    rogue: Annotated[str | None, typer.Option(
        help="K:MIB: the last K jobs also allocate MIB MiB after their first step.")] = None,
    timeout: Annotated[float | None, typer.Option(help="Stop a run's jobs after SECONDS.")
                       ] = None,
    wait: Annotated[float | None, typer.Option(
        help="Jobs queue up to SECONDS for their budget (MEMGOV_WAIT) instead of failing.")
    ] = None,
    pin: Annotated[bool, typer.Option(help="Pin each job to its share of cores.")] = False,
    history: Annotated[bool, typer.Option(help="Record measured peaks for --claim auto.")
                       ] = True,
    host_per_job: Annotated[str, typer.Option(
        help="Host memory one job needs: SIZE, auto (recorded peaks; 2GiB before any) or off. "
             "A job starts only when the host can hold it; others wait.")] = "auto",
    compile_cache: Annotated[str, typer.Option(
        help="JAX: one compilation cache for the jobs, warmed by one job before the others "
             "start: auto (a folder in the report folder), off, or a folder of your own.")
    ] = "auto",
    python: Annotated[str | None, typer.Option(help="Interpreter for {python} in the manifest.")
                      ] = None,
    progress: Annotated[bool, typer.Option(help="Live progress on stderr.")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="Print report.json on stdout.")
                       ] = False,
) -> None:
    from memgov.cli.progress import PackProgress
    from memgov.pack import PackConfig, config, run

    try:
        cfg = PackConfig(
            experiment=experiment, n=n, framework=framework, mode=mode, claim=claim, mps=mps,
            mps_daemons=mps_daemons,
            epochs=epochs, batch=batch, runner=runner, image=image, out=out, device=device,
            gpu=gpu, threads=_threads(threads), parallel=parallel, baseline=baseline,
            baseline_args=shlex.split(baseline_args), solo=solo, timeout=timeout, wait=wait,
            pin=pin, history=history, host_per_job=host_per_job, python=python or sys.executable,
            compile_cache=compile_cache,
            trainer_args=list(trainer_args or []),
            sweep=config.parse_sweep(sweep) if sweep is not None else None,
            rogue=config.parse_rogue(rogue) if rogue is not None else None,
        )
        observer = PackProgress() if progress else None
        try:
            outcome = run(cfg, observer)
        finally:
            if observer is not None:
                observer.close()
    except (MemgovError, ValueError) as exc:
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


def _threads(text: str) -> int | None:
    if text.strip().lower() == "auto":
        return None
    if not text.strip().isdigit() or int(text) < 1:
        raise ValueError(f"--threads {text!r}: accepted auto or a whole number >= 1")
    return int(text)


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
            console.print(f"note: {run['label']}: {run['connections']}", highlight=False,
                          markup=False)
        gate = run.get("host_gate") or {}
        if gate.get("jobs_that_waited"):
            console.print(
                f"note: {run['label']}: {gate['jobs_that_waited']} job(s) waited for host memory"
                f" (~{gate['per_job_mib']:,.0f} MiB each: {gate['source']}; "
                f"{gate['reserve_mib']:,.0f} MiB kept free); --host-per-job sets the estimate",
                highlight=False, markup=False)
    files = report.get("files", {})
    console.print(f"report: {files.get('json')}  csv: {files.get('csv')}  "
                  f"plot: {files.get('plot') or files.get('plot_error')}", highlight=False,
                  markup=False)  # paths and the install hint's [plots] are text, not markup
