"""Parsing and printing memory sizes.

Binary units follow Docker and HAMi ("2G" is 2 GiB); a trailing "B" after an SI prefix ("2GB") is
decimal, as disk vendors and the SI mean it. Anything ambiguous or out of range is refused with the
list of accepted forms, so a typo never turns into a silently wrong budget.
"""

from __future__ import annotations

import math
import re

ACCEPTED = (
    'accepted: an integer number of bytes (e.g. 1073741824), a number with a unit '
    '("512MiB", "1.5GiB", "2G" = 2 GiB, "2GB" = 2 * 10**9 bytes; units B, K/KiB, M/MiB, G/GiB, '
    'T/TiB, KB, MB, GB, TB, case-insensitive), or a percentage of the device ("25%")'
)

_BINARY = {"": 1, "b": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
_UNITS: dict[str, int] = {
    **_BINARY,
    **{f"{p}ib": v for p, v in _BINARY.items() if p not in ("", "b")},
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
}
# re.ASCII: \d would otherwise accept other scripts' digits ("٣GiB" read as 3 GiB).
_SIZE = re.compile(r"^\s*(?P<num>\d+(?:\.\d+)?|\.\d+)\s*(?P<unit>[a-zA-Z]*)\s*$", re.ASCII)
_PERCENT = re.compile(r"^\s*(?P<num>\d+(?:\.\d+)?|\.\d+)\s*%\s*$", re.ASCII)


def parse_size(value: object, *, total: int | None = None, what: str = "size") -> int:
    """Return ``value`` as a positive number of bytes.

    ``total`` is the device's memory: it resolves percentages and bounds the result. ``what`` names
    the value in error messages (e.g. "MEMGOV_CLAIM").
    """
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"{what}: {value!r} is not a size; {ACCEPTED}")
    if isinstance(value, str) and len(value) > 64:
        raise ValueError(f"{what}: {value[:20]!r}... is not a size (too long); {ACCEPTED}")
    size = value if isinstance(value, int) else _parse_text(value, total, what)
    if size > MAX_BYTES:
        raise ValueError(f"{what}: {_short(value)} is larger than any device (at most 2**62 bytes)")
    if size <= 0:
        raise ValueError(f"{what}: {_short(value)} must be more than 0 bytes; {ACCEPTED}")
    if total is not None and size > total:
        raise ValueError(
            f"{what}: {value!r} ({format_size(size)}) is larger than the device "
            f"({format_size(total)})"
        )
    return size


MAX_BYTES = 2**62
"""No device is this large; a bigger request is a mistake, refused before any arithmetic."""


def _short(value: object) -> str:
    # repr(10**4000) raises ValueError (int to str conversion limit): never print all of it.
    if isinstance(value, int) and value.bit_length() > 200:
        return f"an integer of {value.bit_length()} bits"
    return repr(value)


def _parse_text(text: str, total: int | None, what: str) -> int:
    percent = _PERCENT.match(text)
    if percent:
        pct = float(percent["num"])
        if not 0 < pct <= 100:
            raise ValueError(f"{what}: {text!r} must be a percentage in (0, 100]")
        if total is None:
            raise ValueError(f"{what}: {text!r} is a percentage, but no device size is known yet")
        return int(total * pct / 100)
    match = _SIZE.match(text)
    unit = match["unit"].lower() if match else None
    if not match or unit not in _UNITS:
        raise ValueError(f"{what}: cannot read {text!r} as a size; {ACCEPTED}")
    number = float(match["num"])
    if not math.isfinite(number):
        raise ValueError(f"{what}: {text!r} is not a finite size; {ACCEPTED}")
    if unit in ("", "b") and "." in match["num"]:
        raise ValueError(f"{what}: {text!r} is a fraction of a byte; {ACCEPTED}")
    return int(number * _UNITS[unit])


def format_size(size: int | float | None) -> str:
    """Human-readable binary size: "2.00 GiB", "884 MiB", "512 B"; "-" for None."""
    if size is None:
        return "-"
    if abs(size) >= 2**30:
        return f"{size / 2**30:.2f} GiB"
    if abs(size) >= 2**20:
        return f"{size / 2**20:.0f} MiB"
    if abs(size) >= 2**10:
        return f"{size / 2**10:.0f} KiB"
    return f"{int(size)} B"


def mib(size: int | float | None) -> float | None:
    """Bytes to MiB (for reports), keeping None."""
    return None if size is None else round(size / 2**20, 1)
