"""`memgov ray ...`: the node side of memgov on Ray (docs/ray.md). Ray is imported in commands only.

- ``memgov ray node-resources``: the ``ray start`` flags that declare this node's GPU memory;
- ``memgov ray status [--address A]``: every node's ledger, gathered by one small task per node.
- ``memgov ray pack EXPERIMENT``: the pack experiment over the cluster (memgov/ray/_pack.py).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any

import typer

from memgov._base.errors import MemgovError
from memgov.cli._common import JsonFlag, attempt, fail
from memgov.cli._packoptions import command, own

if TYPE_CHECKING:
    from memgov.ray._pack import RayReport

ray_app = typer.Typer(
    help="Ray clusters: declare GPU memory to Ray, see every node's ledger.",
    no_args_is_help=True,
    add_completion=False,
)


RAY_INSTALL = "pip install 'memgov-gpu[ray]'"


def require_ray(command: str) -> None:
    """Exit 2 with one line, not a traceback, where Ray cannot be imported.
    (node-resources needs no Ray: it only prints the flags for `ray start`.)"""
    try:
        import ray  # noqa: F401
    except ImportError as exc:
        typer.echo(
            f"memgov ray {command}: needs Ray, which cannot be imported here ({exc}); "
            f"install it with {RAY_INSTALL}",
            err=True,
        )
        raise typer.Exit(2) from None


@ray_app.command("node-resources")
def node_resources(as_json: JsonFlag = False) -> None:
    """Flags for `ray start` on this node: --num-gpus and --resources (gpu_memory, GPU type)."""
    from memgov.ray._node import node_resources as declared_now, ray_start_flags

    declared = attempt(declared_now)
    if as_json:
        typer.echo(
            json.dumps({**declared, "flags": ray_start_flags(declared)}, indent=2, sort_keys=True)
        )
        return
    for note in declared["notes"]:
        typer.echo(f"# note: {note}", err=True)
    typer.echo(ray_start_flags(declared))


@ray_app.command("status")
def status(
    address: Annotated[str | None, typer.Option(help="Ray address (default: auto).")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Every node's ledger: per node, per GPU, the claims of Ray tasks and of everyone else."""
    require_ray("status")
    from memgov.ray._node import cluster_status

    try:
        data = cluster_status(address)
    except (MemgovError, ConnectionError, RuntimeError) as exc:
        typer.echo(f"memgov: cannot reach the Ray cluster: {exc}", err=True)
        raise typer.Exit(2) from None
    if as_json:
        typer.echo(json.dumps(data, indent=2, sort_keys=True))
        return
    from rich.console import Console

    Console().print(cluster_table(data))


def cluster_table(data: dict[str, Any]) -> Any:
    from rich.table import Table

    from memgov._base.sizes import format_size

    table = Table(title="memgov status (Ray cluster)")
    for column in ("node", "GPU", "total", "claimed", "outside", "free", "claims", "queued"):
        table.add_column(column)
    for node in data["nodes"]:
        label = f"{node.get('hostname', '?')}\n{node['node_id'][:12]}"
        if node.get("error"):
            table.add_row(label, f"[red]{node['error']}[/]", "", "", "", "", "", "")
        if not node.get("devices") and not node.get("error"):
            table.add_row(label, "[dim](no GPU)[/]", "", "", "", "", "", "")
        for i, dev in enumerate(node.get("devices", [])):
            table.add_row(
                label if i == 0 else "",
                dev["uuid"],
                format_size(dev["total"]),
                format_size(dev["claimed"]),
                format_size(dev["outside"]),
                format_size(dev["free"]),
                str(len(dev["claims"])),
                str(len(dev["queue"])),
            )
        table.add_section()
    return table


def pack(
    *,
    experiment: str,
    trainer_args: list[str] | None,
    address: str | None,
    gpu_type: str | None,
    as_json: bool,
    out: str | None,
    **options: Any,
) -> None:
    """The pack experiment over a Ray cluster's GPUs: one report, per job, GPU and node."""
    from pathlib import Path

    from memgov.cli._packoptions import config
    from memgov.pack.config import check_options

    try:
        cfg = config("ray", options, experiment=experiment, trainer_args=list(trainer_args or []))
        check_options(cfg, "ray")
    except MemgovError as exc:
        raise fail(exc) from None
    require_ray("pack")
    from memgov.ray._pack import run

    try:
        report = run(cfg, gpu_type, address, Path(out) if out else None)
    except (MemgovError, OSError) as exc:  # ConfigError is a ValueError too
        typer.echo(f"memgov ray pack: {exc}", err=True)
        raise typer.Exit(2) from None
    if as_json:
        typer.echo(json.dumps(report, indent=1))
    else:
        from rich.console import Console

        Console().print(pack_table(report))
    raise typer.Exit(1 if report["failed"] else 0)


ray_app.command("pack")(
    command(
        pack,
        "ray",
        [
            own(
                "experiment",
                Annotated[str, typer.Argument(help="Experiment folder (same path on every node).")],
            ),
            own(
                "trainer_args",
                Annotated[
                    list[str] | None, typer.Argument(help="Extra trainer arguments (after --).")
                ],
                None,
            ),
            own(
                "address",
                Annotated[str | None, typer.Option(help="Ray address (default: auto).")],
                None,
            ),
            own(
                "gpu_type",
                Annotated[
                    str | None,
                    typer.Option(
                        "--gpu", help=("GPU type (per-GPU capacity, e.g. 16GiB) on mixed clusters.")
                    ),
                ],
                None,
            ),
        ],
        [
            own("out", Annotated[str | None, typer.Option(help="Folder for report.json.")], None),
            own("as_json", JsonFlag, False),
        ],
    )
)


_COUNTS = ("jobs", "ok", "failed", "samples_per_s")


def pack_table(report: RayReport) -> Any:
    from rich.table import Table

    table = Table(
        title=f"memgov ray pack: {report['ok']} ok, {report['failed']} failed, "
        f"{report['aggregate_samples_per_s']} samples/s, {report['wall_s']} s"
    )
    for column in ("scope", "where", "jobs", "ok", "failed", "samples/s"):
        table.add_column(column)
    for scope, rows, where in (
        ("node", report["per_node"], lambda row: f"{row['node']} {row['node_id'][:12]}"),
        ("GPU", report["per_gpu"], lambda row: row["gpu"]),
    ):
        for row in rows:
            table.add_row(scope, where(row), *(str(row[k]) for k in _COUNTS))
        table.add_section()
    for job in report["jobs"]:
        what = "ok" if job["status"] == "ok" else f"{job['reason']}: {job['detail']}"
        table.add_row(
            f"job {job['job']}",
            f"{job['node_id'][:12]}/{job['gpu']}",
            "",
            "",
            what,
            str(job["samples_per_s"]),
        )
    return table
