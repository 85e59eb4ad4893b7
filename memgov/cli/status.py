"""`memgov status`, `memgov gc`, `memgov devices`: the ledger and the GPUs, for people or --json."""

from __future__ import annotations

import json
import time
from typing import Annotated, Any

import typer

from memgov._base.errors import MemgovError
from memgov.cli._common import JsonFlag, attempt, fail, print_json


def status(
    as_json: JsonFlag = False,
    watch: Annotated[
        float | None,
        typer.Option("--watch", min=0.2, help="Refresh every SECONDS until Ctrl-C."),
    ] = None,
) -> None:
    """Per GPU: total, used (NVML), claimed, free budget, and every claim."""
    try:
        if watch is None:
            data = _snapshot()
            if as_json:
                print_json(data)
            else:
                from memgov.cli.render import console, status_table

                console().print(status_table(data))
                if "no_gpu" in data:
                    typer.echo(data["no_gpu"])
            return
        _watch(watch, as_json)
    except MemgovError as exc:
        raise fail(exc) from None


def _watch(seconds: float, as_json: bool) -> None:
    import sys

    from rich.live import Live

    from memgov import _status
    from memgov.cli.render import console, status_table

    try:
        if as_json or not sys.stdout.isatty():
            # A pipe or a file: one snapshot after another, each written out as it is taken
            # (a redirected --watch stopped by a signal keeps every snapshot it took).
            while True:
                data = _snapshot()
                if as_json:
                    typer.echo(json.dumps(data, sort_keys=True))
                else:
                    console().print(status_table(data))
                    if "no_gpu" in data:
                        typer.echo(data["no_gpu"])
                sys.stdout.flush()
                time.sleep(seconds)
        with Live(status_table(_status.status()), auto_refresh=False) as live:
            while True:
                time.sleep(seconds)
                live.update(status_table(_status.status()), refresh=True)
    except KeyboardInterrupt:
        return


def _snapshot() -> dict[str, Any]:
    """The status, and where it lists no GPU, why (NVML's reason) and how to try memgov."""
    from memgov import _status

    data = _status.status()
    if not data["devices"]:
        data["no_gpu"] = _no_gpu_hint()
    return data


def gc(as_json: JsonFlag = False) -> None:
    """Remove the records of dead holders and say what was removed or skipped. Run by root, it is
    also the set-up of a ledger shared by several users: it makes every device's folders."""
    import os

    from memgov import _status
    from memgov._cpu import share as _cpushare

    try:
        snaps = _status.snapshots(clean=True, set_up=os.geteuid() == 0)
        cpu_removed = _cpushare.sweep()  # root's gc clears any user's dead files there too
        squatted, stuck = _status.clear_squatters() if os.geteuid() == 0 else ([], [])
    except MemgovError as exc:
        raise fail(exc) from None
    removed = [*squatted, *(r for s in snaps for r in s.removed)]
    problems = [*stuck, *(p for s in snaps for p in s.problems)]
    rebuilt = [r for s in snaps for r in s.rebuilt]
    if as_json:
        found = {"removed": removed, "skipped": problems, "cpu_removed": cpu_removed}
        print_json({**found, "rebuilt": rebuilt})
        return
    if cpu_removed:
        typer.echo(f"removed {cpu_removed} file(s) no process holds from the CPU-share folder")
    for line in rebuilt:
        typer.echo(f"rebuilt {line}")
    for line in removed:
        typer.echo(f"removed {line}")
    for line in problems:
        typer.echo(f"skipped {line}")
    typer.echo(f"{len(removed)} removed, {len(problems)} skipped")


def devices(as_json: JsonFlag = False) -> None:
    """The GPUs memgov sees (NVML, or simulated with MEMGOV_DEVICES)."""
    from memgov._gpu.devices import devices as list_devices
    from memgov._status import device_dict

    found = attempt(lambda: [device_dict(d) for d in list_devices()])
    if as_json:
        print_json({"devices": found})
        return
    from memgov.cli.render import console, devices_table

    console().print(devices_table(found))
    if not found:
        typer.echo(_no_gpu_hint())


def _no_gpu_hint() -> str:
    from memgov._gpu.devices import no_gpu_hint

    return no_gpu_hint()
