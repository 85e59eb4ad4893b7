"""Every MEMGOV_* setting: one table (:data:`TABLE`), and one parser per row.

Each row names a variable, the forms it accepts (the text its errors quote), its default and its
meaning. Only the row's parser checks a value: :func:`get` reads the variable and parses it, and
everything else (``claim()``, auto-enable, ``memgov run``, pack, ``memgov doctor``) asks here, so a
setting cannot be read two ways. An error starts with the variable and its value and says what is
accepted (``MEMGOV_WAIT='soon': accepted seconds >= 0 ...``); the same parsers check function
arguments and command-line options, under their own names (``wait=``, ``--wait``).

The table also gives the variables that wake auto-enable (:data:`TRIGGERS`, from which setup.py
writes the ``.pth`` line: :func:`pth_line`), the variables pack and ``memgov run`` decide for each
job (:func:`names`), ``memgov doctor``'s list (:func:`report`) and the table in
docs/auto-enable.md (:func:`markdown`; tests/core/test_settings.py compares them).

Reading is cheap and follows ``os.environ`` (tests and pack change it between calls). Imports stay
at the bottom layer (``_errors``, ``_sizes``): every core module may ask here.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from memgov._base.errors import ConfigError
from memgov._base.sizes import Size

DEFAULT_DIR = "/tmp/memgov-ledger"
SHARED_DIR = "/run/memgov-ledger"
"""The ledger of a host many users share (docs/ledger.md, "Many users on a host"): the default
wherever root has made it, so no user's process falls back to a second ledger of its own."""
"""Ledger folder when MEMGOV_DIR is unset. One per host: bind-mount it into containers. Not
"/tmp/memgov": Python started in /tmp would import that folder as the memgov package."""
DEFAULT_RESERVE_REAL = 256 * 2**20
"""Kept free on a real GPU beyond what NVML reports used (driver growth, fragmentation)."""
DEFAULT_CONTEXTS = 72
"""CUDA contexts (processes without MPS) admitted per real GPU. The H200 refused new contexts
with "CUDA error: out of memory" at 76 (256 MiB clients) and at 104 (MNIST jobs), most memory
free; 72 stays under both. Simulated devices have no contexts: no limit unless set."""
DEFAULT_MPS_CLIENTS = 48
"""Clients one MPS server admits per GPU: 48 measured on the H200 (Volta and later; 16 before)."""
MPS_POLICIES = ("fill", "spread")
DEFAULT_GIVE_BACK_S = 120.0
"""How long a first-run claim's peak must stay flat before the claim shrinks (docs/profiles.md)."""

CLAIM_ACCEPTED = (
    "accepted a size (e.g. 2GiB, 512MiB, 25%), 'growth' (no cap, no greedy preallocation), "
    "'auto' (a GPU scheduler's budget, else the job's measured profile, else a first-run share "
    "of what is free; docs/profiles.md) or 'off'"
)
JOB_ACCEPTED = (
    "accepted a job name of 1 to 128 printable characters (e.g. mnist-b64), or unset: derived "
    "from the command (docs/profiles.md)"
)
WAIT_ACCEPTED = (
    "accepted seconds >= 0 to queue for the budget (e.g. 60); 0 (or None, or unset) fails at once"
)
THREADS_ACCEPTED = (
    "accepted auto (default: a share of the usable cores, followed as governed processes come "
    "and go), once (that share, computed once at start), off (memgov leaves threads alone) or a "
    "whole number of CPU threads >= 1"
)
FLAG_ACCEPTED = "accepted 1/true/yes/on or 0/false/no/off"
SIM_FORMAT = (
    "MEMGOV_DEVICES: accepted a comma-separated list of NAME:TOTAL[:USED], e.g. "
    '"sim0:16GiB,sim1:80GiB:2GiB" (NAME of letters, digits, "_", "-", "."; USED is memory taken '
    "by processes outside memgov)"
)
_SIM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
RESERVED_NAMES = frozenset({"cpu"})
"""Folders of the ledger's v1/ that are not a device's (_cpushare.PARTS): a simulated GPU of
that name would put its claims inside them."""
SCHEDULER_TRIGGERS = (
    "CUDA_DEVICE_MEMORY_LIMIT",
    "ALIYUN_COM_GPU_MEM_CONTAINER",
    "GPU_PORTION",
    "NVIDIA_GPU_MEMORY_",
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
    "SLURM_SHARDS_ON_NODE",
)
"""Name prefixes of the GPU schedulers' budget variables (memgov/_gpu/schedulers.py reads them)."""


def named(what: str, value: object) -> str:
    """How an error names a value: ``NAME='x'`` (a variable or argument), ``--opt 'x'``."""
    return f"{what} {value!r}" if what.startswith("-") else f"{what}={value!r}"


# -- parsers: (value, name) -> the value, or ConfigError naming it and what is accepted ----------


@dataclass(frozen=True)
class Threads:
    """MEMGOV_THREADS, parsed."""

    mode: str
    """"auto" (followed share), "once" (share at start), "off", or "fixed"."""
    count: int | None = None


def claim_setting(value: str, what: str = "MEMGOV_CLAIM") -> str | Size:
    """``growth``, ``auto``, ``off`` (lower case), or a checked size (resolved per device later)."""
    text = value.strip()
    if text.lower() in ("growth", "auto", "off"):
        return text.lower()
    try:
        return Size(text, what)
    except ConfigError as exc:  # said with every form MEMGOV_CLAIM takes, not a size's alone
        raise ConfigError(f"{named(what, value)}: {CLAIM_ACCEPTED} ({exc.problem})") from None


def wait_seconds(value: object, what: str = "wait") -> float | None:
    """Seconds to queue for a budget, as a number (an argument or option); None: fail at once."""
    if value is None:
        return None
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number or not 0 <= value < float("inf"):  # type: ignore[operator]  # NaN fails too
        raise ConfigError(f"{named(what, value)}: {WAIT_ACCEPTED}")
    return float(value) or None  # type: ignore[arg-type]


def _wait_text(value: str, what: str) -> float | None:
    """MEMGOV_WAIT: the same rule as :func:`wait_seconds`, for text."""
    try:
        seconds = float(value.strip())
    except ValueError:
        raise ConfigError(f"{named(what, value)}: {WAIT_ACCEPTED}") from None
    try:
        return wait_seconds(seconds, what)
    except ConfigError:
        raise ConfigError(f"{named(what, value)}: {WAIT_ACCEPTED}") from None


def threads_setting(value: str, what: str = "MEMGOV_THREADS") -> Threads:
    text = value.strip()
    lowered = text.lower()
    if lowered in ("", "auto"):
        return Threads("auto")
    if lowered in ("once", "off"):
        return Threads(lowered)
    if text.isdigit() and int(text) >= 1:
        return Threads("fixed", int(text))
    raise ConfigError(f"{named(what, value)}: {THREADS_ACCEPTED}")


def job_name(value: object, what: str = "MEMGOV_JOB") -> str:
    """A job's name for its profile: printable, 1-128 characters, no surrounding blanks."""
    text = value.strip() if isinstance(value, str) else None
    if not text or len(text) > 128 or not text.isprintable():
        raise ConfigError(f"{named(what, value)}: {JOB_ACCEPTED}")
    return text


def positive_number(text: str) -> float | None:
    """The finite number above 0 that ``text`` is; None for any other text (0, a negative
    number, inf, NaN, not a number)."""
    try:
        number = float(text)
    except ValueError:
        return None
    return number if 0 < number < float("inf") else None


def _give_back(value: str, what: str) -> float | None:
    """Seconds a first-run claim's peak must stay flat before it shrinks; ``off``: never."""
    text = value.strip().lower()
    if text == "off":
        return None
    seconds = positive_number(text)
    if seconds is None:
        raise ConfigError(
            f"{named(what, value)}: accepted seconds > 0 (how long a first-run claim's peak must "
            "stay flat before the claim shrinks to it) or off"
        )
    return seconds


def flag(value: str, what: str) -> bool:
    raw = value.strip().lower()
    if raw in ("", "0", "false", "no", "off"):
        return False
    if raw in ("1", "true", "yes", "on"):
        return True
    raise ConfigError(f"{named(what, value)}: {FLAG_ACCEPTED}")


def _text(value: str, what: str) -> str:
    return value.strip()


def _folder(value: str, what: str) -> Path:
    path = Path(value.strip())
    if not path.is_absolute():
        raise ConfigError(
            f"{named(what, value.strip())} must be an absolute path (processes started from "
            "other folders and other containers must find the same ledger)"
        )
    if path.parts[1:2] in (("proc",), ("sys",)) or ".." in path.parts:
        raise ConfigError(
            f"{named(what, value.strip())}: /proc and /sys are the kernel's views (their links "
            "lead into other processes' folders) and '..' is not accepted; accepted: an "
            "absolute path to a folder on a local filesystem, e.g. /tmp/memgov-ledger"
        )
    return path


def _size(value: str, what: str) -> Size:
    return Size(value.strip(), what)


def _reserve(value: str, what: str) -> Size | int:
    """A size or a percentage of each device; 0 keeps nothing back."""
    return 0 if value.strip() in ("0", "0B", "0%") else _size(value, what)


def _bytes(value: str, what: str) -> int:
    """A size with no device to be a percentage of."""
    size = _size(value, what)
    if size.bytes is None:
        raise ConfigError(
            f"{named(what, value)}: accepted a size (e.g. 160MiB, or bytes), not a percentage"
        )
    return size.bytes


def _whole(accepted: str, off: bool = False) -> Callable[[str, str], int]:
    def parse(value: str, what: str) -> int:
        text = value.strip().lower()
        if off and text == "off":
            return 0
        if not text.isdigit() or int(text) < 1:
            raise ConfigError(f"{named(what, value)}: {accepted}")
        return int(text)

    return parse


def _choice(accepted: str, *choices: str) -> Callable[[str, str], str]:
    def parse(value: str, what: str) -> str:
        text = value.strip().lower()
        if text not in choices:
            raise ConfigError(f"{named(what, value)}: {accepted}")
        return text

    return parse


def simulated(value: str, what: str = "MEMGOV_DEVICES") -> list[tuple[str, int, int]]:
    """MEMGOV_DEVICES: (name, total bytes, bytes used outside memgov) per simulated GPU."""
    found: list[tuple[str, int, int]] = []
    for item in value.split(","):
        parts = [p.strip() for p in item.split(":")]
        if len(parts) not in (2, 3) or not _SIM_NAME.match(parts[0]):
            raise ConfigError(f"{what} item {item.strip()!r} is not valid; {SIM_FORMAT}")
        if parts[0] in RESERVED_NAMES:
            raise ConfigError(
                f"{what} names a GPU {parts[0]!r}: the ledger's folder of that name holds the "
                f"CPU-share records, not a device's claims; {SIM_FORMAT}, other than "
                + ", ".join(sorted(RESERVED_NAMES))
            )
        if any(name == parts[0] for name, _, _ in found):
            raise ConfigError(f"{what} names {parts[0]!r} twice; {SIM_FORMAT}")
        total = Size(parts[1], f"{what} {parts[0]} total", also=SIM_FORMAT).on(None)
        used = 0
        if len(parts) == 3 and parts[2] not in ("0", "0B"):
            used = Size(parts[2], f"{what} {parts[0]} used", also=SIM_FORMAT).on(total)
        found.append((parts[0], total, used))
    return found


# -- the table ----------------------------------------------------------------------------------


class Row(NamedTuple):
    name: str
    accepted: str
    """The forms, as the docs' table shows them (errors say them in words)."""
    default: str
    meaning: str
    parse: Callable[[str, str], Any]
    unset: Any = None
    """What :func:`get` returns when the variable is unset or blank."""
    job: bool = False
    """Decided for each governed process: ``memgov run`` and pack set it per job, and pack
    never passes its own value on. The others describe the host (ledger, devices, limits)."""
    internal: bool = False
    """Set by memgov for its child processes, not by users."""

    @property
    def wakes(self) -> bool:
        """Whether setting it wakes auto-enable (the .pth line looks for it)."""
        return self.name == "MEMGOV_CLAIM"


# One row, one block: the table reads as a table.
# fmt: off
_SIZE_FORMS = "a size (`2GiB`, `512MiB`, bytes) or a percentage of each device (`25%`)"
TABLE: tuple[Row, ...] = (
    Row("MEMGOV_CLAIM", "a size (`2GiB`, `512MiB`, `25%`, bytes), `growth`, `auto`, `off`",
        "unset: `auto` when a scheduler's variable woke auto-enable",
        "the budget claimed at the first framework import; `growth`: no claim and no cap, "
        "frameworks only stop preallocating; `auto`: a GPU scheduler's budget, else the job's "
        "measured profile (peak + 10 % + 64 MiB), else a first-run share of the free budget "
        "(docs/profiles.md); unset: a scheduler's budget, else growth; `off`: nothing, even with "
        "scheduler variables set",
        claim_setting, job=True),
    Row("MEMGOV_JOB", "a name (1-128 printable characters)", "derived from the command",
        "the job whose profile (measured peaks) sizes `auto` claims and records this run; as "
        "`claim(job=...)`, `memgov run --job`", job_name, job=True),
    Row("MEMGOV_GIVE_BACK", "seconds > 0, `off`", f"`{DEFAULT_GIVE_BACK_S:g}`",
        "a soft first-run `auto` claim shrinks to its peak + 10 % + 64 MiB once the peak has "
        "stayed flat this long, counted from its first GPU work (docs/profiles.md)", _give_back,
        DEFAULT_GIVE_BACK_S, job=True),
    Row("MEMGOV_DEVICE", "index (`cuda:N`, `N`), GPU UUID, `auto`", "the first visible GPU",
        "the GPU to claim on, as `claim(device=...)`", _text, job=True),
    Row("MEMGOV_WAIT", "seconds >= 0", "`0`: fail at once",
        "queue up to that long for the budget, first come first served", _wait_text, job=True),
    Row("MEMGOV_STRICT", "`1`/`true`/`yes`/`on`, `0`/`false`/`no`/`off`", "off",
        "fail (raise from the framework's `import`) instead of warning; garbage in it warns and "
        "counts as off", flag, False, job=True),
    Row("MEMGOV_QUIET", "`1`/`true`/`yes`/`on`, `0`/`false`/`no`/`off`", "off",
        "no info lines on stderr (warnings still print)", flag, False, job=True),
    Row("MEMGOV_GC_FREEZE", "`1`/`true`/`yes`/`on`, `0`/`false`/`no`/`off`", "on",
        "the collector paused through the governed framework import, then one collection and "
        "`gc.freeze()`: later full collections skip what was alive then (a cycle among those "
        "objects dropped later is never freed; docs/auto-enable.md); off leaves the collector "
        "alone", flag, True, job=True),
    Row("MEMGOV_THREADS", "`auto`, `once`, `off`, whole number >= 1", "`auto`",
        "CPU threads: this process's share of the usable cores among the governed processes on "
        "them, followed as they come and go (docs/threads.md); `once`: the share at start; `N` "
        "fixes it; `off` leaves threads alone", threads_setting, Threads("auto"), job=True),
    Row("MEMGOV_VIEWS", "`1`/`true`/`yes`/`on`, `0`/`false`/`no`/`off`", "on",
        "inside a claim, torch's `mem_get_info` and pynvml's `nvmlDeviceGetMemoryInfo` report the "
        "budget as the claimed device's memory (docs/adapters.md, \"What a governed process "
        "sees\"); off: the card's own figures", flag, True, job=True),
    Row("MEMGOV_MPS", "`auto`, `off`", "`auto`",
        "`auto`: hard mode (MPS's driver-enforced limit) when an MPS daemon is reachable; `off`: "
        "always soft", _choice("accepted auto (default: hard mode when an MPS daemon is "
                               "reachable) or off (always soft)", "auto", "off"),
        "auto", job=True),
    Row("MEMGOV_DIR", "absolute path", f"`{SHARED_DIR}` where root made it, else `{DEFAULT_DIR}`",
        "the host's ledger folder (bind-mount it into containers)", _folder, Path(DEFAULT_DIR)),
    Row("MEMGOV_DEVICES", "`NAME:TOTAL[:USED],...`", "real GPUs (NVML)",
        "simulated GPUs instead of NVML's, for machines without a GPU (CI, laptops)", simulated),
    Row("MEMGOV_RESERVE", _SIZE_FORMS, "256 MiB on a real GPU, 0 on a simulated one",
        "kept out of every device's budget (driver growth, fragmentation)", _reserve),
    Row("MEMGOV_CONTEXTS", "whole number >= 1, `off`",
        f"{DEFAULT_CONTEXTS} on a real GPU, no limit on a simulated one",
        "claims without MPS admitted per GPU: each is a CUDA context, and a GPU runs out of "
        "contexts long before memory (the context wall, docs/hard-limits.md)",
        _whole(f"accepted a whole number >= 1 (claims without MPS per GPU; default "
               f"{DEFAULT_CONTEXTS} on a real GPU) or off", off=True)),
    Row("MEMGOV_MPS_CLIENTS", "whole number >= 1", f"{DEFAULT_MPS_CLIENTS}",
        "hard-mode claims one MPS daemon admits per GPU",
        _whole("accepted a whole number >= 1 (MPS admits 48 clients per GPU on Volta and later, "
               "16 before)"), DEFAULT_MPS_CLIENTS),
    Row("MEMGOV_MPS_POLICY", "`fill`, `spread`", "`fill`",
        "which of memgov's MPS daemons a hard claim joins: `fill` the lowest-numbered with room, "
        "`spread` the one with the fewest clients",
        _choice("accepted fill (the lowest-numbered daemon with room, default) or spread (the one "
                "with fewest clients)", *MPS_POLICIES), "fill"),
    Row("MEMGOV_SHARD_SIZE", _SIZE_FORMS, "unset",
        "GPU memory of one Slurm shard (a site setting; budget = SLURM_SHARDS_ON_NODE x it)",
        _size),
    Row("MEMGOV_TORCH_MARGIN", "a size (`160MiB`, bytes)", "160 MiB",
        "torch adapter: room kept below the budget for what CUDA libraries take after start-up",
        _bytes),
    Row("MEMGOV_HOLDER", "set by memgov, not by users", "unset",
        "`<gpu uuid>/<record>` of the claim a governed parent holds: its children claim nothing",
        _text, job=True, internal=True),
    Row("MEMGOV_THREADS_SET", "set by memgov, not by users", "unset",
        "the thread count memgov wrote into OMP_NUM_THREADS and the like (not the user's choice)",
        _text, job=True, internal=True),
    Row("MEMGOV_MPS_LIMIT", "set by memgov, not by users", "unset",
        "the MPS pinned limit memgov set (a child may replace it, never one set by someone else)",
        _text, job=True, internal=True),
    Row("MEMGOV_ENV_SET", "set by memgov, not by users", "unset",
        "names of the variables memgov set (`import memgov`'s no-preallocation defaults, the "
        "adapters' settings), comma-separated: `memgov doctor` shows them apart from the user's",
        _text, job=True, internal=True),
    Row("MEMGOV_WARNED", "set by memgov, not by users", "unset",
        "a digest of the failure auto-enable warned about: children that fail the same way stay "
        "quiet (said once per job)", _text, job=True, internal=True),
)
# fmt: on
ROWS = {row.name: row for row in TABLE}
TRIGGERS = (*(row.name for row in TABLE if row.wakes), *SCHEDULER_TRIGGERS)
"""Variable-name prefixes that wake auto-enable: the .pth line (:func:`pth_line`) checks them."""


def get(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """The parsed value of setting ``name`` (its row's ``unset`` when unset or blank); raises
    ConfigError naming the variable, its value and what it accepts."""
    row = ROWS[name]
    raw = (os.environ if environ is None else environ).get(name, "")
    if not raw.strip():
        return row.unset
    return row.parse(raw, name)


def quiet() -> bool:
    """MEMGOV_QUIET; a value that does not parse leaves memgov's notes on (it is refused where
    the settings are checked)."""
    try:
        return bool(get("MEMGOV_QUIET"))
    except Exception:
        return False


def is_set(name: str) -> bool:
    return bool(os.environ.get(name, "").strip())


def names(*, job: bool | None = None, internal: bool | None = None) -> tuple[str, ...]:
    """The table's variable names, optionally only those decided per job / set by memgov."""
    return tuple(
        r.name
        for r in TABLE
        if (job is None or r.job == job) and (internal is None or r.internal == internal)
    )


def read_all(skip: tuple[str, ...] = ()) -> tuple[dict[str, Any], list[str]]:
    """Every user setting parsed in one pass: (name -> value for those that parse, the errors of
    those that do not). Auto-enable acts on these values, so each is parsed once."""
    values: dict[str, Any] = {}
    found: list[str] = []
    for row in TABLE:
        if row.internal or row.name in skip:
            continue
        try:
            values[row.name] = get(row.name)
        except ConfigError as exc:
            found.append(str(exc))
    return values, found


def problems(skip: tuple[str, ...] = ()) -> list[str]:
    """What is wrong with every user setting in the environment (empty: all can be used)."""
    return read_all(skip)[1]


def report() -> list[dict[str, Any]]:
    """Every row with its value here (``memgov doctor``): value, source, default, problem."""
    found = []
    for row in TABLE:
        raw = os.environ.get(row.name)
        problem = None
        if not row.internal:
            try:
                get(row.name)
            except ConfigError as exc:
                problem = str(exc)
        found.append(
            {
                "name": row.name,
                "value": raw,
                "source": "environment" if raw is not None and raw.strip() else "default",
                "default": row.default,
                "internal": row.internal,
                "problem": problem,
            }
        )
    return found


def pth_line() -> str:
    """The line of memgov-autoenable.pth: imports memgov only when a trigger is set."""
    prefixes = ", ".join(repr(name) for name in TRIGGERS)
    return (
        f"import os; any(k.startswith(({prefixes})) for k in os.environ) and "
        "__import__('memgov._autoenable')._autoenable.start()\n"
    )


def markdown() -> str:
    """The settings table of docs/auto-enable.md."""
    lines = ["| variable | accepted | default | meaning |", "|---|---|---|---|"]
    for row in TABLE:
        lines.append(f"| `{row.name}` | {row.accepted} | {row.default} | {row.meaning} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # python -m memgov._base.settings: the docs' table
    print(markdown(), end="")
