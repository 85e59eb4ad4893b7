"""Queue files (TOML): a list of jobs with their commands, claims and arrival times.

    [queue]            # optional
    policy = "memgov"  # default; `memgov queue run --policy` overrides
    [[job]]
    name = "mnist-1"              # optional, unique; default from the command
    cmd = ["python3", "main.py"]  # a list, or a string split as a shell would (shlex)
    cwd = "scripts/mnist"         # optional, relative to the file's folder
    claim = "auto"                # or a size ("2GiB", "25%"); default auto
    arrival = 0.0                 # seconds after the run starts; default 0
    duration = 12.0               # optional: the solo run time, for SJF when no history
    kind = "mnist"                # optional label grouping jobs (report, slowdown learning)
    env = { KEY = "value" }       # optional, added to the runner's environment
    gpu = 0                       # optional: pin to this GPU (index)

Every mistake is an error naming the file, the job and what is accepted; nothing runs then.
"""

from __future__ import annotations

import math
import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomllib

from memgov._base.errors import ConfigError
from memgov._base.sizes import Size
from memgov.decide.policies import resolve

MAX_FILE_BYTES = 1024 * 1024
MAX_JOBS = 10_000
JOB_KEYS = ("name", "cmd", "cwd", "claim", "arrival", "duration", "kind", "env", "gpu")
QUEUE_KEYS = ("policy",)
CLAIM_ACCEPTED = "accepted 'auto' or a size such as 2GiB, 512MiB or 25% (of the GPU)"


@dataclass(frozen=True)
class JobSpec:
    """One job as a file or `memgov queue add` gives it (before it has an id)."""

    name: str
    cmd: list[str]
    cwd: str
    env: dict[str, str]
    claim: str | Size = "auto"
    arrival: float = 0.0
    duration: float | None = None
    kind: str = ""
    gpu: int | None = None


@dataclass(frozen=True)
class QueueFile:
    path: Path
    policy: str | None
    jobs: list[JobSpec]
    digest: str
    """Its content's SHA-256 (prefix): a run of the same file resumes instead of adding twice."""


def load(path: str | os.PathLike[str]) -> QueueFile:
    """Read and check a queue file; ConfigError (naming the file) for anything wrong in it."""
    from hashlib import sha256

    where = Path(path)
    try:
        with open(where, "rb") as file:
            raw = file.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"queue file {where}: {exc.strerror or exc}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigError(f"queue file {where} is larger than {MAX_FILE_BYTES} bytes")
    try:
        data = tomllib.loads(raw.decode())
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(
            f"queue file {where} is not TOML ({exc}); accepted: an optional [queue] table and "
            "[[job]] tables (docs/queue.md)"
        ) from None
    policy = _queue_table(data, where)
    jobs = _jobs(data, where)
    digest = sha256(str(where.resolve()).encode() + b"\0" + raw).hexdigest()[:16]
    return QueueFile(where, policy, jobs, digest)


def _queue_table(data: dict[str, Any], where: Path) -> str | None:
    unknown = sorted(set(data) - {"queue", "job"})
    if unknown:
        raise ConfigError(
            f"queue file {where}: unknown top-level key(s) {', '.join(map(repr, unknown))}; "
            "accepted: [queue] (policy) and [[job]] tables"
        )
    table = data.get("queue", {})
    if not isinstance(table, dict):
        raise ConfigError(f"queue file {where}: 'queue' must be a table ([queue])")
    extra = sorted(set(table) - set(QUEUE_KEYS))
    if extra:
        raise ConfigError(
            f"queue file {where}: [queue] has unknown key(s) {', '.join(map(repr, extra))}; "
            f"accepted: {', '.join(QUEUE_KEYS)}"
        )
    policy = table.get("policy")
    if policy is None:
        return None
    if not isinstance(policy, str):
        raise ConfigError(f"queue file {where}: [queue] policy must be a string")
    try:  # refused here, with the file, before any of its jobs is queued
        resolve(policy)
    except ConfigError as exc:
        raise ConfigError(f"queue file {where}: [queue] {exc}") from None
    return policy


def _jobs(data: dict[str, Any], where: Path) -> list[JobSpec]:
    tables = data.get("job", [])
    if not isinstance(tables, list) or not tables:
        raise ConfigError(f"queue file {where}: no jobs; write each as a [[job]] table with a cmd")
    if len(tables) > MAX_JOBS:
        raise ConfigError(f"queue file {where}: {len(tables)} jobs, at most {MAX_JOBS} accepted")
    specs: list[JobSpec] = []
    for number, table in enumerate(tables, 1):
        specs.append(job_spec(table, f"queue file {where}: job {number}", where.parent))
    names = [s.name for s in specs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(
            f"queue file {where}: job names must be unique; used more than once: "
            f"{', '.join(map(repr, twice[:5]))} (give each a name = ...)"
        )
    return specs


def job_spec(table: Any, what: str, base: Path) -> JobSpec:
    """A JobSpec from one [[job]] table; ``what`` names it in errors, ``base`` anchors ``cwd``."""
    if not isinstance(table, dict):
        raise ConfigError(f"{what}: not a table; write it as [[job]] with cmd = [...]")
    cmd = _cmd(table.get("cmd"), what)
    name = table.get("name", default_name(cmd))
    if not isinstance(name, str) or not name.strip() or len(name) > 128 or not name.isprintable():
        shown = name if not isinstance(name, str) else name[:40] + ("..." if len(name) > 40 else "")
        raise ConfigError(f"{what}: name {shown!r}: accepted 1-128 printable characters")
    what = f"{what} ({name!r})"
    unknown = sorted(set(table) - set(JOB_KEYS))
    if unknown:
        raise ConfigError(
            f"{what}: unknown key(s) {', '.join(map(repr, unknown))}; accepted: "
            f"{', '.join(JOB_KEYS)}"
        )
    cwd = table.get("cwd", ".")
    if not isinstance(cwd, str):
        raise ConfigError(f"{what}: cwd must be a string (a folder, relative to the file's)")
    folder = (base / cwd).resolve()
    if not folder.is_dir():
        raise ConfigError(f"{what}: cwd {cwd!r} is not a folder ({folder})")
    return JobSpec(
        name=name.strip(),
        cmd=cmd,
        cwd=str(folder),
        env=_env(table.get("env", {}), what),
        claim=claim_value(table.get("claim", "auto"), f"{what}: claim"),
        arrival=_seconds(table.get("arrival", 0.0), f"{what}: arrival", zero=True) or 0.0,
        duration=_seconds(table.get("duration"), f"{what}: duration", zero=False),
        kind=_text(table.get("kind", ""), f"{what}: kind"),
        gpu=_gpu(table.get("gpu"), what),
    )


def default_name(cmd: list[str]) -> str:
    """A job's name when none is given: the program and its first arguments."""
    words = [os.path.basename(cmd[0]), *cmd[1:]]
    if words[0].startswith("python") and len(words) > 1:
        words = words[1:]
    text = "".join(c if c.isprintable() else " " for c in " ".join(words))
    return " ".join(text.split())[:64] or "job"


def claim_value(value: Any, what: str) -> str | Size:
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    try:
        return Size(value, what)
    except ConfigError as exc:
        raise ConfigError(f"{what} {value!r}: {CLAIM_ACCEPTED} ({exc.problem})") from None


def _cmd(value: Any, what: str) -> list[str]:
    if isinstance(value, str):
        try:
            value = shlex.split(value)
        except ValueError as exc:
            raise ConfigError(
                f"{what}: cmd {value!r} cannot be split as a shell would ({exc})"
            ) from None
    if not isinstance(value, list) or not value or not all(isinstance(a, str) for a in value):
        raise ConfigError(
            f"{what}: cmd is missing or not a command; accepted a list of strings "
            '(cmd = ["python3", "train.py"]) or one string split as a shell would'
        )
    return list(value)


def _env(value: Any, what: str) -> dict[str, str]:
    ok = isinstance(value, dict) and all(
        isinstance(k, str) and k and "=" not in k and isinstance(v, str) for k, v in value.items()
    )
    if not ok:
        raise ConfigError(f'{what}: env must be a table of strings (env = {{ KEY = "value" }})')
    return dict(value)


def _seconds(value: Any, what: str, zero: bool) -> float | None:
    if value is None:
        return None
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or value < 0 or (value == 0 and not zero):
        least = ">= 0" if zero else "> 0"
        raise ConfigError(f"{what} {value!r}: accepted a number of seconds {least}")
    return float(value)


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str) or len(value) > 64 or not value.isprintable():
        raise ConfigError(f"{what} {value!r}: accepted a label of at most 64 printable characters")
    return value


def _gpu(value: Any, what: str) -> int | None:
    if value is None:
        return None
    if type(value) is not int or value < 0:
        raise ConfigError(f"{what}: gpu {value!r}: accepted a GPU index (0, 1, ...)")
    return value
