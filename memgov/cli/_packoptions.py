"""The options of ``memgov pack`` and ``memgov ray pack``, made from PackConfig's fields.

Every pack option is defined once, as a field of :class:`memgov.pack.config.PackConfig`; this
module turns those fields into typer parameters (:func:`command`), reads the command line's values
back into a PackConfig (:func:`config`).
A command here declares only what is its own (the experiment, ``--json``, Ray's ``--address``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Annotated, Any

import typer

from memgov.pack.config import Described, PackConfig, options


def command(
    func: Callable[..., Any],
    front: str,
    before: list[inspect.Parameter],
    after: list[inspect.Parameter],
) -> Callable[..., Any]:
    """``func`` with the parameters typer reads: the command's own ``before``, the options of
    ``front``, the command's own ``after``. ``func`` takes them as keyword arguments;
    :func:`config` reads the options back."""
    params = list(before)
    for described in options(front):
        params.append(
            inspect.Parameter(
                described.name,
                inspect.Parameter.KEYWORD_ONLY,
                default=_cli_default(described),
                annotation=_annotation(described, front),
            )
        )
    params += after
    func.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    func.__annotations__ = {p.name: p.annotation for p in params}
    return func


def own(name: str, annotation: Any, default: Any = inspect.Parameter.empty) -> inspect.Parameter:
    """A parameter of the command itself (not a pack option)."""
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation
    )


def config(front: str, values: dict[str, Any], **fixed: Any) -> PackConfig:
    """The PackConfig of a command line: each option's value as typer gave it, read by the
    option's ``text`` where it takes text; ``fixed``: the experiment and trainer arguments."""
    read = {}
    for described in options(front):
        value = values[described.name]
        if described.spec.text is not None:
            if value is None:  # not given: the field's default (--python: pack's own)
                continue
            value = described.spec.text(value)
        read[described.name] = value
    return PackConfig(**fixed, **read)


def _cli_type(described: Described) -> Any:
    if described.spec.text is None:
        return described.type
    return str if described.text_default is not None else (str | None)


def _cli_default(described: Described) -> Any:
    return described.default if described.spec.text is None else described.text_default


def _annotation(described: Described, front: str) -> Any:
    spec = described.spec
    flag = described.flag
    if described.type is bool:
        flag = f"{flag}/--no-{flag[2:]}"
    names = [flag, *([spec.short] if spec.short else [])]
    text = (spec.ray_help if front == "ray" else "") or spec.help
    return Annotated[_cli_type(described), typer.Option(*names, help=text)]
