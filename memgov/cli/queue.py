"""`memgov queue ...`: jobs placed on GPUs by one policy (docs/placement.md).

- ``memgov queue simulate --trace FILE --nodes FILE --policy P``: replay a trace on a simulated
  cluster by the FGD paper's protocol (memgov/placement/simulate.py) and print the allocation
  curve and the final share of GPUs allocated.

The placement library needs numpy, imported in the command only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from memgov._errors import MemgovError
from memgov.cli._common import JsonFlag, fail, print_json

queue_app = typer.Typer(
    help="Place jobs on GPUs by a policy; simulate a policy on a cluster trace.",
    no_args_is_help=True,
    add_completion=False,
)

CURVE_POINTS = (10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110, 120, 130)


@queue_app.command("simulate")
def simulate(
    trace: Annotated[Path, typer.Option(help="Jobs CSV (Alibaba cluster-trace-gpu-v2023 layout).")],
    nodes: Annotated[Path, typer.Option(help="Nodes CSV (sn,cpu_milli,memory_mib,gpu,model).")],
    policy: Annotated[
        str, typer.Option(help="random, dotprod (tetris), gpupacking, bestfit, fgd, memgov.")
    ] = "memgov",
    seed: Annotated[int, typer.Option(help="Seed of the arrival order and inflation.")] = 42,
    as_json: JsonFlag = False,
) -> None:
    """Replay a trace on a simulated cluster; print the allocation curve and final GPU share."""
    try:
        from memgov.placement import get_policy, load_nodes, load_trace
        from memgov.placement import simulate as run_simulation
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
