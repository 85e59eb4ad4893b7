"""The report protocol between a trainer and ``memgov pack`` (see README.md).

One JSON object per line on stdout, each with key ``"event"``: start, progress (at most every 2 s
within an epoch), epoch, done or error.
Nothing else may reach stdout, so :func:`protect_stdout` moves everything else to stderr.
"""

from __future__ import annotations

import json
import math
import os
import sys
import traceback
from collections.abc import Callable
from typing import NoReturn, TextIO

EXIT_CODES = {"oom": 3, "cuda": 4, "other": 1}

_OOM_TYPES = {"OutOfMemoryError", "ResourceExhaustedError", "MemoryError"}
_OOM_TEXT = (
    "out of memory",
    "resource_exhausted",
    "oom when allocating",
    "cuda_error_out_of_memory",
)
_CUDA_TYPES = {"AcceleratorError", "CudaError"}
_CUDA_TEXT = ("cuda", "cudnn", "cublas", "nccl", "device-side assert")

_out: TextIO = sys.stdout


class UsageError(RuntimeError):
    """A request the trainer cannot honour (e.g. --device gpu without a GPU); kind "other"."""


def protect_stdout() -> None:
    """Keep stdout for reports only.

    Frameworks and the C++ libraries under them print banners and warnings to file descriptor 1,
    which would corrupt the JSON stream a packer reads. Reports keep a private duplicate of the
    original stdout; fd 1 and ``sys.stdout`` are pointed at stderr.
    """
    global _out
    sys.stdout.flush()
    _out = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr


def emit(event: str, **fields: object) -> None:
    """Write one report line and flush it, so a packer sees progress as it happens."""
    record = {"event": event, **{k: _plain(v) for k, v in fields.items()}}
    _out.write(json.dumps(record, allow_nan=False) + "\n")
    _out.flush()


def _plain(value: object) -> object:
    if hasattr(value, "item") and callable(value.item):  # numpy / framework scalars
        value = value.item()
    # NaN/inf are not JSON; a diverged loss is reported as null rather than a line parsers reject.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def classify(exc: BaseException) -> str:
    """Return "oom", "cuda" or "other" for an exception, looking through its causes.

    Frameworks wrap device errors in their own types (Keras, XLA), so both type names along
    the chain and well-known message fragments count.
    """
    if isinstance(exc, UsageError):
        return "other"
    names: set[str] = set()
    texts: list[str] = []
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        names.update(t.__name__ for t in type(cur).__mro__)
        texts.append(str(cur).lower())
        cur = cur.__cause__ or cur.__context__
    text = "\n".join(texts)
    if names & _OOM_TYPES or any(m in text for m in _OOM_TEXT):
        return "oom"
    if names & _CUDA_TYPES or any(m in text for m in _CUDA_TEXT):
        return "cuda"
    return "other"


def run(main: Callable[[], None]) -> NoReturn:
    """Run ``main``; on an exception report it as an error event and exit with its code."""
    try:
        main()
    except Exception as exc:
        kind = classify(exc)
        traceback.print_exc()
        emit("error", kind=kind, message=f"{type(exc).__name__}: {exc}"[:4000])
        sys.stderr.flush()
        # Skip interpreter teardown: after a device fault, framework atexit hooks can hang or
        # crash and replace the exit code the packer relies on.
        os._exit(EXIT_CODES[kind])
    sys.exit(0)
