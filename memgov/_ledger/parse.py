"""Reading a record's JSON with bounds: other users can write anything into the ledger.

Size is bounded by the caller (64 KiB); here: nesting depth (no RecursionError), number length
(no 5,000-digit parse, no 10**400 OverflowError), finite numbers in range, string length. A file
outside the bounds is reported and skipped, never a crash.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

Fields = dict[str, type | tuple[type, ...]]
"""A record kind's required fields and their types."""

CLAIM_FIELDS: Fields = {
    "version": int,
    "id": str,
    "kind": str,
    "device": str,
    "bytes": int,
    "name": str,
    "pid": int,
    "created": (int, float),
}
"""A claim record or queue ticket (memgov/_ledger/ledger.py)."""
CPU_FIELDS: Fields = {
    "version": int,
    "kind": str,
    "pid": int,
    "created": (int, float),
    "cpus": list,
}
"""A CPU-share record (memgov/_cpu/share.py)."""
_TEXT_FIELDS = ("id", "kind", "device", "name", "host", "mode", "holder", "source", "why")


MAX_DEPTH = 8
MAX_DIGITS = 20
MAX_TEXT = 4096
_RANGES: dict[str, tuple[float, float]] = {
    "version": (0, 2**31),
    "bytes": (1, 2**62),
    "pid": (0, 2**31),
    "pidns": (0, 2**63),
    "created": (0, 2**40),
    "compute": (0, 100),
}


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_DIGITS:
        raise ValueError(f"a number of {len(text)} digits")
    return int(text)


def _bounded_float(text: str) -> float:
    if len(text) > 64:
        raise ValueError(f"a number of {len(text)} characters")
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"a number out of range ({text[:20]})")
    return value


def _no_constant(text: str) -> float:
    raise ValueError(f"{text} is not accepted")


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_BRACKET = re.compile(r"[\[\]{}]")


def too_deep(text: str, limit: int = MAX_DEPTH) -> bool:
    """Whether JSON text nests deeper than ``limit``, counting brackets outside strings (no
    recursion). A text with no more brackets than ``limit`` (a ledger record has 2-3) cannot:
    said without a walk. Otherwise the strings are cut out (a regular expression, in C) and only
    the brackets left are walked."""
    if text.count("[") + text.count("{") <= limit:
        return False
    return _walk(text) > limit


def _walk(text: str) -> int:
    depth = deepest = 0
    for bracket in _BRACKET.findall(_STRING.sub("", text)):
        if bracket in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def load_bounded(raw: bytes) -> tuple[Any, str | None]:
    """JSON from another user's file, with bounds on depth, number length and range (the
    caller bounds the size): (value, None), or (None, why not)."""
    try:
        text = raw.decode()
        if too_deep(text):
            return None, f"corrupt JSON (nested deeper than {MAX_DEPTH})"
        return json.loads(
            text,
            parse_int=_bounded_int,
            parse_float=_bounded_float,
            parse_constant=_no_constant,
        ), None
    except (UnicodeDecodeError, ValueError, RecursionError, OverflowError) as exc:
        return None, f"corrupt JSON ({str(exc)[:200]})"


def _parse(raw: bytes, required: Fields = CLAIM_FIELDS) -> tuple[dict[str, Any] | None, str | None]:
    """Parse a record with bounds on size (the caller's), depth, number length and range;
    ``required``: the fields its kind must have (CLAIM_FIELDS, CPU_FIELDS)."""
    data, problem = load_bounded(raw)
    if problem is not None:
        return None, problem
    if not isinstance(data, dict):
        return None, "not a JSON object"
    for key, kind in required.items():
        value = data.get(key)
        if not isinstance(value, kind) or isinstance(value, bool):
            return None, f"field {key!r} missing or of the wrong type"
    for key, (low, high) in _RANGES.items():
        value = data.get(key)
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if number and not low <= value <= high:  # type: ignore[operator]
            return None, f"field {key!r} out of range ({low:g} to {high:g})"
    for key in _TEXT_FIELDS:
        value = data.get(key)
        if isinstance(value, str) and len(value) > MAX_TEXT:
            return None, f"field {key!r} longer than {MAX_TEXT} characters"
    if data["version"] != 1:  # _records.VERSION (this module is below _records)
        return None, f"record version {data['version']} (this memgov reads version 1)"
    return data, None


def printable(text: str) -> str:
    """``text`` with control and other non-printable characters as escapes: file names and
    record fields are other users' text, and must not send sequences to anyone's terminal."""
    if text.isprintable():  # the common case, checked in C
        return text[:MAX_TEXT]
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[:MAX_TEXT])
