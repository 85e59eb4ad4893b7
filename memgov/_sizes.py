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
    return Size(value, what).on(total)


class Size:
    """A size as asked for, checked once: a number of bytes, or a percentage of a device that
    :meth:`on` resolves for each device. ``what`` (a variable or argument name) stays with it, so
    an error found later, on a device too small, still names where the size came from."""

    __slots__ = ("bytes", "percent", "value", "what")

    def __init__(self, value: object, what: str = "size") -> None:
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise ValueError(f"{what}: {value!r} is not a size; {ACCEPTED}")
        if isinstance(value, str) and len(value) > 64:
            raise ValueError(f"{what}: {value[:20]!r}... is not a size (too long); {ACCEPTED}")
        self.value: int | str = value
        self.what = what
        self.percent: float | None = None
        self.bytes: int | None = None
        if isinstance(value, str):
            self.percent = _percent(value, what)
        if self.percent is None:
            self.bytes = value if isinstance(value, int) else _parse_text(value, what)
            _bounded(self.bytes, value, what)

    @classmethod
    def of(cls, value: object, what: str = "size") -> Size:
        """``value`` itself if it is already a checked Size, else ``Size(value, what)``."""
        return value if isinstance(value, Size) else cls(value, what)

    def on(self, total: int | None, where: str = "the device") -> int:
        """Bytes on a device of ``total`` bytes (None: no device known, percentages refused).

        The one comparison of a size with a device; ``where`` names that device in the error
        (memgov/_devices.py's ``sizes_on`` is how claim(), memgov run and pack reach it)."""
        value, what = self.value, self.what
        size = self.bytes
        if size is None:
            if total is None:
                raise ValueError(f"{what}: {value!r} is a percentage, but no device size is "
                                 "known yet")
            size = int(total * (self.percent or 0) / 100)
            _bounded(size, value, what)
        if total is not None and size > total:
            raise ValueError(
                f"{what}: {value!r} ({format_size(size)}) is larger than {where} "
                f"({format_size(total)}); accepted at most {format_size(total)} or a percentage "
                f"of {where}"
            )
        return size

    def __str__(self) -> str:
        return str(self.value)

    def __repr__(self) -> str:
        return f"Size({self.value!r}, what={self.what!r})"


def _bounded(size: int, value: object, what: str) -> None:
    if size > MAX_BYTES:
        raise ValueError(f"{what}: {_short(value)} is larger than any device (at most 2**62 bytes)")
    if size <= 0:
        raise ValueError(f"{what}: {_short(value)} must be more than 0 bytes; {ACCEPTED}")


MAX_BYTES = 2**62
"""No device is this large; a bigger request is a mistake, refused before any arithmetic."""


def _short(value: object) -> str:
    # repr(10**4000) raises ValueError (int to str conversion limit): never print all of it.
    if isinstance(value, int) and value.bit_length() > 200:
        return f"an integer of {value.bit_length()} bits"
    return repr(value)


def _percent(text: str, what: str) -> float | None:
    """The percentage ``text`` asks for, or None when it is not a percentage."""
    percent = _PERCENT.match(text)
    if not percent:
        return None
    pct = float(percent["num"])
    if not 0 < pct <= 100:
        raise ValueError(f"{what}: {text!r} must be a percentage in (0, 100]")
    return pct


def _parse_text(text: str, what: str) -> int:
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
