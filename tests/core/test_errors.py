"""One error hierarchy that users catch: every error memgov raises on purpose is a
memgov.MemgovError, names itself by its public path (psutil's way: ``__module__``), is listed in
README.md's "Errors", and a bad argument to memgov.claim() is a memgov.ConfigError raised where the
problem is found, saying what is accepted."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

import memgov
import memgov.exporter
import memgov.pack.manifest
import memgov.pack.runners
import memgov.placement.trace
from memgov._base.sizes import Size, parse_size

ROOT = Path(__file__).resolve().parents[2]


def every_error_class() -> set[type]:
    found: set[type] = set()
    todo: list[type] = [memgov.MemgovError]
    while todo:
        cls = todo.pop()
        found.add(cls)
        todo.extend(cls.__subclasses__())
    return found


def readme_errors() -> set[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("### Errors") :]
    section = section[: section.index("\n## ")]
    return set(re.findall(r"^\| `([\w.]+)` \|", section, flags=re.M))


@pytest.mark.parametrize(
    "cls", sorted(every_error_class(), key=str), ids=lambda c: getattr(c, "__name__", repr(c))
)
def test_each_error_names_its_public_path_and_is_documented(cls: type) -> None:
    public = f"{cls.__module__}.{cls.__qualname__}"
    assert not any(part.startswith("_") for part in cls.__module__.split(".")), (
        f"{public}: set __module__ to where users import it from"
    )
    assert getattr(importlib.import_module(cls.__module__), cls.__qualname__) is cls
    assert public in readme_errors(), f"{public} is missing from README.md's Errors table"


def test_the_readme_lists_no_error_that_is_gone() -> None:
    assert readme_errors() == {f"{c.__module__}.{c.__qualname__}" for c in every_error_class()}


@pytest.mark.parametrize(
    ("kwargs", "said"),
    [
        ({"size": "lots"}, r"^claim size: cannot read 'lots' as a size; accepted: .*; or 'auto'"),
        ({"size": "150%"}, r"^claim size: '150%' must be a percentage in \(0, 100\]; accepted"),
        ({"size": 0}, r"^claim size: 0 must be more than 0 bytes; accepted"),
        ({"size": "1GiB", "name": ""}, r"^name='': accepted a printable string"),
        ({"size": "1GiB", "wait": -1}, r"^wait=-1: accepted seconds >= 0"),
    ],
    ids=["size", "percent", "zero", "name", "wait"],
)
def test_claim_refuses_bad_arguments_with_memgovs_own_error(
    monkeypatch: pytest.MonkeyPatch, kwargs: dict[str, object], said: str
) -> None:
    monkeypatch.setenv("MEMGOV_DEVICES", "sim0:16GiB")
    with pytest.raises(memgov.ConfigError, match=said) as info:
        memgov.claim(**kwargs)  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError)  # old `except ValueError` still catches it
    assert type(info.value).__module__ == "memgov"
    assert memgov.current() is None  # nothing held


def test_a_size_says_where_it_came_from_and_every_form_it_takes() -> None:
    """One rule at the source: the parser names the setting and what that setting accepts,
    so no caller rewords it."""
    with pytest.raises(
        memgov.ConfigError,
        match=r"^--claim: cannot read 'x' as a size; "
        r"accepted: .*; or auto \(measured",
    ):
        Size("x", "--claim", also="auto (measured peaks)")
    size = Size("8GiB", "MEMGOV_CLAIM", also="growth")
    with pytest.raises(
        memgov.ConfigError,
        match=r"^MEMGOV_CLAIM: '8GiB' .* larger than gpu0 "
        r".*; accepted at most .*; or growth$",
    ):
        size.on(4 * 2**30, "gpu0")
    with pytest.raises(memgov.ConfigError, match=r"^budget: '1%' is a percentage, but no device"):
        parse_size("1%", what="budget")
