"""Reading traces and node lists (CSV, the layout of Alibaba's cluster-trace-gpu-v2023).

A trace has one job a row: ``name,cpu_milli,memory_mib,num_gpu,gpu_milli`` and optionally
``gpu_spec`` (accepted models joined by ``|``) and ``footprint_mib``; other columns are ignored.
A node list: ``sn`` (or ``name``), ``cpu_milli``, ``memory_mib``, ``gpu``, ``model``, optionally
``gpu_memory_mib``. A bad file is refused whole, saying the file, the row and what is accepted:
a row with fewer or more fields than the header is refused (a file cut short is not half a
trace). A UTF-8 byte-order mark before the header (as spreadsheets write it) is read as such.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from memgov import MemgovError
from memgov.decide.model import MILLI, Demand, Node

T = TypeVar("T")

TRACE_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
NODE_COLUMNS = ("cpu_milli", "memory_mib", "gpu", "model")


_EXTRA = "\0extra"
"""Where csv.DictReader files the fields of a row longer than its header."""


class TraceError(MemgovError, ValueError):
    """A trace, node list or placement argument memgov cannot use; says what is accepted."""


def _rows(path: Path, required: tuple[str, ...], what: str) -> Iterator[tuple[int, dict[str, str]]]:
    try:
        handle = path.open(newline="", encoding="utf-8-sig")
    except OSError as exc:
        raise TraceError(f"{what} {str(path)!r}: cannot be read ({exc.strerror})") from None
    with handle:
        reader = csv.DictReader(handle, restkey=_EXTRA)
        try:
            header = reader.fieldnames or []
        except (UnicodeDecodeError, csv.Error) as exc:
            raise TraceError(f"{what} {str(path)!r}: not a CSV file ({exc})") from None
        missing = [c for c in required if c not in header]
        if missing:
            raise TraceError(
                f"{what} {str(path)!r}: missing column(s) {', '.join(missing)}; accepted a CSV "
                f"with a header naming at least {', '.join(required)}"
            )
        try:
            for line, row in enumerate(reader, start=2):
                # DictReader fills a short row's missing fields with None and files a long
                # row's extras under restkey: either way the row is not what the header says.
                extra = row.pop(_EXTRA, None)
                short = sum(value is None for value in row.values())
                if extra or short:
                    count = len(header) + len(extra) if extra else len(header) - short
                    raise TraceError(
                        f"{what} {str(path)!r} line {line}: {count} field(s) where the header "
                        f"names {len(header)}; accepted rows of exactly as many"
                    )
                yield line, row
        except (UnicodeDecodeError, csv.Error) as exc:
            raise TraceError(f"{what} {str(path)!r}: not a CSV file ({exc})") from None


def _number(row: dict[str, str], column: str, where: str, low: int, high: int) -> int:
    text = (row.get(column) or "").strip()
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (value == value and value.is_integer() and low <= value <= high):
        raise TraceError(
            f"{where}: {column}={text!r}; accepted a whole number from {low} to {high}"
        ) from None
    return int(value)


def _parse_all(
    path: Path, required: tuple[str, ...], what: str, parse: Callable[[dict[str, str], str], T]
) -> list[T]:
    found = [
        parse(row, f"{what} {str(path)!r} line {line}") for line, row in _rows(path, required, what)
    ]
    if not found:
        raise TraceError(f"{what} {str(path)!r}: no rows; accepted a CSV with at least one")
    return found


def _demand(row: dict[str, str], where: str) -> Demand:
    num_gpu = _number(row, "num_gpu", where, 0, 64)
    gpu_milli = _number(row, "gpu_milli", where, 0, MILLI)
    if num_gpu and not gpu_milli:
        raise TraceError(f"{where}: num_gpu={num_gpu} with gpu_milli=0; accepted 1-1000 per GPU")
    if num_gpu > 1 and gpu_milli < MILLI:
        raise TraceError(
            f"{where}: num_gpu={num_gpu} with gpu_milli={gpu_milli}; a job on several GPUs "
            "takes them whole (gpu_milli=1000)"
        )
    footprint = (row.get("footprint_mib") or "").strip()
    return Demand(
        name=(row.get("name") or "").strip() or where,
        cpu_milli=_number(row, "cpu_milli", where, 0, 10**9),
        memory_mib=_number(row, "memory_mib", where, 0, 10**12),
        num_gpu=num_gpu,
        gpu_milli=gpu_milli if num_gpu else 0,
        gpu_spec=tuple(s for s in (row.get("gpu_spec") or "").split("|") if s.strip()),
        footprint_mib=_number(row, "footprint_mib", where, 0, 10**9) if footprint else None,
    )


def _node(row: dict[str, str], where: str) -> Node:
    name = (row.get("sn") or row.get("name") or "").strip() or where
    gpus = _number(row, "gpu", where, 0, 64)
    memory = (row.get("gpu_memory_mib") or "").strip()
    return Node(
        name=name,
        cpu_milli=_number(row, "cpu_milli", where, 1, 10**9),
        memory_mib=_number(row, "memory_mib", where, 0, 10**12),
        gpus=gpus,
        model=(row.get("model") or "").strip() if gpus else "",
        gpu_memory_mib=_number(row, "gpu_memory_mib", where, 0, 10**9) if memory else 0,
    )


def load_trace(path: str | Path) -> list[Demand]:
    """The jobs of a trace CSV, in file order."""
    return _parse_all(Path(path), TRACE_COLUMNS, "trace", _demand)


def load_nodes(path: str | Path) -> list[Node]:
    """The nodes of a node-list CSV; at least one must have a GPU."""
    nodes = _parse_all(Path(path), NODE_COLUMNS, "node list", _node)
    if not any(n.gpus for n in nodes):
        raise TraceError(f"node list {str(path)!r}: no node has a GPU (column gpu); accepted >= 1")
    return nodes
