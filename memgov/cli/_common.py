"""What every command group shares: the --json flag, printing JSON, and the error exit.

typer only: the --json path of a command never imports rich (render.py does).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import typer

from memgov._base.errors import MemgovError

T = TypeVar("T")

JsonFlag = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]


def fail(exc: Exception) -> typer.Exit:
    """Say what went wrong on stderr; the caller raises the returned exit (status 2)."""
    typer.echo(f"memgov: {exc}", err=True)
    return typer.Exit(2)


def attempt(action: Callable[[], T], *also: type[Exception]) -> T:
    """``action()``; a MemgovError (or one of ``also``) is said on stderr, then exit status 2."""
    caught: tuple[type[Exception], ...] = (MemgovError, *also)
    try:
        return action()
    except caught as exc:
        raise fail(exc) from None


def print_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, sort_keys=True))
