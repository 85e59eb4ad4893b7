"""Parsing and printing memory sizes.

Binary units follow Docker and HAMi ("2G" is 2 GiB); a trailing "B" after an SI prefix ("2GB") is
decimal, as disk vendors and the SI mean it. Anything ambiguous or out of range is refused with the
list of accepted forms, so a typo never turns into a silently wrong budget.

Every such refusal is a :class:`memgov.ConfigError` (a ValueError too) raised here, at the source:
it names the setting the size came from (``what``: ``MEMGOV_CLAIM``, ``--claim``, ``claim()``'s
``size``) and the forms it accepts, with the setting's own further forms (``also``: ``auto``).
"""

from __future__ import annotations

import math
import re

from memgov._base.errors import ConfigError

ACCEPTED = (
    "accepted: an integer number of bytes (e.g. 1073741824), a number with a unit "
    '("512MiB", "1.5GiB", "2G" = 2 GiB, "2GB" = 2 * 10**9 bytes; units B, K/KiB, M/MiB, G/GiB, '
    'T/TiB, KB, MB, GB, TB, case-insensitive), or a percentage of the device ("25%")'
)

_BINARY = {"": 1, "b": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40, "p": 2**50, "e": 2**60}
"""P and E too: no device is that large, but a size written with them is refused as too large,
not as unreadable."""
_UNITS: dict[str, int] = {
    **_BINARY,
    **{f"{p}ib": v for p, v in _BINARY.items() if p not in ("", "b")},
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "pb": 10**15,
    "eb": 10**18,
}
# re.ASCII: \d would otherwise accept other scripts' digits ("٣GiB" read as 3 GiB).
_SIZE = re.compile(r"^\s*(?P<num>\d+(?:\.\d+)?|\.\d+)\s*(?P<unit>[a-zA-Z]*)\s*$", re.ASCII)
_PERCENT = re.compile(r"^\s*(?P<num>\d+(?:\.\d+)?|\.\d+)\s*%\s*$", re.ASCII)


def parse_size(
    value: object, *, total: int | None = None, what: str = "size", also: str = ""
) -> int:
    """Return ``value`` as a positive number of bytes, or raise ConfigError.

    ``total`` is the device's memory: it resolves percentages and bounds the result. ``what`` names
    the value in error messages (e.g. "MEMGOV_CLAIM"); ``also``: what else it accepts ("auto").
    """
    return Size(value, what, also).on(total)


class Size:
    """A size as asked for, checked once: a number of bytes, or a percentage of a device that
    :meth:`on` resolves for each device. ``what`` (a variable or argument name) and ``also`` (the
    setting's further forms, e.g. "auto") stay with it, so an error found later, on a device too
    small, still names where the size came from and what it could have been."""

    __slots__ = ("also", "bytes", "percent", "value", "what")

    def __init__(self, value: object, what: str = "size", also: str = "") -> None:
        self.what = what
        self.also = also
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise self.error(f"{value!r} is not a size")
        if isinstance(value, str) and len(value) > 64:
            raise self.error(f"{value[:20]!r}... is not a size (too long)")
        self.value: int | str = value
        self.percent: float | None = None
        self.bytes: int | None = None
        if isinstance(value, str):
            self.percent = self._percent(value)
        if self.percent is None:
            self.bytes = value if isinstance(value, int) else self._parse_text(value)
            self._bounded(self.bytes)

    @classmethod
    def of(cls, value: object, what: str = "size", also: str = "") -> Size:
        """``value`` itself if it is already a checked Size, else ``Size(value, what, also)``."""
        return value if isinstance(value, Size) else cls(value, what, also)

    def error(self, problem: str, accepted: str = ACCEPTED) -> ConfigError:
        """The one form of a size's error: the setting, the problem, what is accepted."""
        also = f"; or {self.also}" if self.also else ""
        error = ConfigError(f"{self.what}: {problem}; {accepted}{also}")
        error.problem = problem
        return error

    def on(self, total: int | None, where: str = "the device") -> int:
        """Bytes on a device of ``total`` bytes (None: no device known, percentages refused).

        The one comparison of a size with a device; ``where`` names that device in the error
        (memgov/_gpu/devices.py's ``sizes_on`` is how claim(), memgov run and pack reach it)."""
        value = self.value
        size = self.bytes
        if size is None:
            if total is None:
                raise self.error(
                    f"{value!r} is a percentage, but no device size is known yet",
                    "accepted a size in bytes or with a unit (e.g. 2GiB)",
                )
            size = int(total * (self.percent or 0) / 100)
            self._bounded(size)
        if total is not None and size > total:
            raise self.error(
                f"{value!r} ({format_size(size)}) is larger than {where} ({format_size(total)})",
                f"accepted at most {format_size(total)} or a percentage of {where}",
            )
        return size

    def _bounded(self, size: int) -> None:
        if size > MAX_BYTES:
            raise self.error(
                f"{_short(self.value)} is larger than any device", "accepted at most 2**62 bytes"
            )
        if size <= 0:
            raise self.error(f"{_short(self.value)} must be more than 0 bytes")

    def _percent(self, text: str) -> float | None:
        """The percentage ``text`` asks for, or None when it is not a percentage."""
        percent = _PERCENT.match(text)
        if not percent:
            return None
        pct = float(percent["num"])
        if not 0 < pct <= 100:
            raise self.error(
                f"{text!r} must be a percentage in (0, 100]",
                'accepted a percentage of the device above 0 and at most 100 ("25%")',
            )
        return pct

    def _parse_text(self, text: str) -> int:
        match = _SIZE.match(text)
        unit = match["unit"].lower() if match else None
        if not match or unit not in _UNITS:
            raise self.error(f"cannot read {text!r} as a size")
        number = float(match["num"])
        if not math.isfinite(number):
            raise self.error(f"{text!r} is not a finite size")
        if unit in ("", "b") and "." in match["num"]:
            raise self.error(f"{text!r} is a fraction of a byte")
        return int(number * _UNITS[unit])

    def __str__(self) -> str:
        return str(self.value)

    def __repr__(self) -> str:
        return f"Size({self.value!r}, what={self.what!r})"


MAX_BYTES = 2**62
"""No device is this large; a bigger request is a mistake, refused before any arithmetic."""


def _short(value: object) -> str:
    # repr(10**4000) raises ValueError (int to str conversion limit): never print all of it.
    if isinstance(value, int) and value.bit_length() > 200:
        return f"an integer of {value.bit_length()} bits"
    return repr(value)


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
