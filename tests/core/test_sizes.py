"""Sizes: every accepted form gives the documented bytes; every malformed one a clear error."""

from __future__ import annotations

import pytest

from memgov import format_size, parse_size

GIB = 2**30
TOTAL = 64 * GIB


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (1073741824, GIB),
        ("1073741824", GIB),
        ("512MiB", 512 * 2**20),
        ("512 mib", 512 * 2**20),
        ("1.5GiB", int(1.5 * GIB)),
        ("2G", 2 * GIB),
        ("2g", 2 * GIB),
        ("2GB", 2 * 10**9),
        ("1K", 1024),
        ("1KB", 1000),
        ("1T", 2**40),
        ("1TB", 10**12),
        (".5G", GIB // 2),
        ("  2 GiB  ", 2 * GIB),
        ("7B", 7),
        ("25%", TOTAL // 4),
        ("100%", TOTAL),
        ("12.5 %", TOTAL // 8),
    ],
)
def test_accepted_sizes(text: object, expected: int) -> None:
    total = TOTAL if "%" in str(text) else None
    assert parse_size(text, total=total) == expected


MALFORMED = [
    "",
    "   ",
    "abc",
    "GiB",
    "1.5",  # a fraction of a byte
    "1.0B",
    "1e9",
    "-1",
    "-1GiB",
    "0",
    "0GiB",
    "0.0001B",
    "2 GiB/s",
    "1.5.5G",
    "2XB",
    "2 parsecs",
    "0x10",
    "1_000",
    "inf",
    "nan",
    "1" + "0" * 400,  # float() of it is inf
    "٣GiB",  # Arabic-Indic digit: refused, not read as 3 GiB
    "２G",  # full-width digit
    "101%",
    "0%",
    "-5%",
    "%",
    "65GiB",  # more than the 64 GiB device
    0,
    -5,
    1.5,
    True,
    None,
    b"1G",
    [1],
]


@pytest.mark.parametrize("value", MALFORMED, ids=repr)
def test_malformed_sizes_are_refused_with_what_is_accepted(value: object) -> None:
    with pytest.raises(ValueError) as info:
        parse_size(value, total=TOTAL, what="claim size")
    message = str(info.value)
    assert message.startswith("claim size: ")
    assert "accepted" in message or "larger than the device" in message or "(0, 100]" in message


def test_percentage_without_a_device_size_is_refused() -> None:
    with pytest.raises(ValueError, match="no device size is known"):
        parse_size("50%")


def test_larger_than_device_names_both_sizes() -> None:
    with pytest.raises(ValueError, match=r"65\.00 GiB.*larger than the device \(64\.00 GiB\)"):
        parse_size("65GiB", total=TOTAL)


@pytest.mark.parametrize(
    ("size", "text"),
    [(None, "-"), (512, "512 B"), (2048, "2 KiB"), (884 * 2**20, "884 MiB"), (2 * GIB, "2.00 GiB")],
)
def test_format_size(size: int | None, text: str) -> None:
    assert format_size(size) == text
