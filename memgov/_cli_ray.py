"""`memgov ray ...`: the node side of memgov on Ray (docs/ray.md). Ray is imported in commands only.

- ``memgov ray node-resources``: the ``ray start`` flags that declare this node's GPU memory;
- ``memgov ray status [--address A]``: every node's ledger, gathered by one small task per node.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from memgov._errors import MemgovError

ray_app = typer.Typer(
    help="Ray clusters: declare GPU memory to Ray, see every node's ledger.",
    no_args_is_help=True,
    add_completion=False,
)

JsonFlag = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]


@ray_app.command("node-resources")
def node_resources(as_json: JsonFlag = False) -> None:
    """Flags for `ray start` on this node: --num-gpus and --resources (gpu_memory, GPU type)."""
    from memgov.ray._node import node_resources as declared_now
    from memgov.ray._node import ray_start_flags

    try:
        declared = declared_now()
    except MemgovError as exc:
        typer.echo(f"memgov: {exc}", err=True)
        raise typer.Exit(2) from None
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
    try:
        import ray  # noqa: F401
    except ImportError:
        typer.echo("memgov: Ray is not installed; pip install 'memgov[ray]'", err=True)
        raise typer.Exit(2) from None
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

    from memgov._sizes import format_size

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
