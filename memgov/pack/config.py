"""What a pack is asked to do: :class:`PackConfig`, where every option of a pack is defined once.

Each field of PackConfig is one option: the field gives its name, type and default, and
:func:`option` the rest (its ``--help`` line, the docs' wording, how the command line reads it,
its check, the job variable it becomes, and whether ``memgov ray pack`` takes it). Every front end
derives from these fields: ``memgov pack`` (memgov/cli/pack.py) and ``memgov ray pack``
(memgov/cli/ray.py) build their options from :func:`options`, the library takes PackConfig, and
docs/pack.md's option table is generated from them (``python -m memgov.cli.pack``; a test compares
it). A new option is one field here.

Modes:
- ``greedy``: frameworks at their defaults, no memgov variable at all, no thread or MPS
  governance; it reproduces the study (and is the naive baseline).
- ``growth``: ``MEMGOV_CLAIM=growth``: no budget, no greedy preallocation, threads governed.
- ``claim``: ``MEMGOV_CLAIM=<bytes>``: a budget per job on the ledger (hard under MPS), threads
  governed. Jobs run with ``MEMGOV_STRICT=1``: a refused claim stops the job with BudgetExceeded
  instead of letting it run ungoverned.

Fast by default: each governed job gets its share of the CPU from memgov's thread budget
(memgov/_cpu/threads.py: usable cores / governed processes on them, followed as jobs come and go),
the same mechanism as any governed process, because N jobs with one thread per core each spin
against each other (docs/pack.md: 8 torch jobs, 3,129 samples/s at framework defaults against 21,987
for one job alone). ``--threads N`` fixes it (``MEMGOV_THREADS=N``). The jobs' environment is
built in jobenv.py.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memgov._base import settings as _settings
from memgov._base.errors import ConfigError
from memgov._base.sizes import Size
from memgov.pack.runners import DOCKER_IMAGE, RUNNER_CHOICES

MODES = ("greedy", "growth", "claim")
MPS_CHOICES = ("auto", "on", "off")
DEVICES = ("gpu", "cpu")
BASELINES = ("none", "naive")
GiB = 2**30
DEFAULT_CLAIM = GiB
"""``--claim auto`` with no history yet, for a framework whose adapter's facts give no
``default_claim`` (those measured: each adapter's facts)."""
CLAIM_ALSO = "auto (measured peaks, see docs/pack.md)"
"""What else --claim accepts, said in a bad size's error."""
MAX_JOBS = 1024
MAX_COUNT = 10**6
MAX_MPS_DAEMONS = 16
SAME: Any = "(same as memgov pack's)"
"""``Option.ray_default`` where ``memgov ray pack`` has pack's default."""


@dataclass(frozen=True)
class Option:
    """Everything a front end needs to offer one field of :class:`PackConfig` (see option())."""

    help: str
    """The ``--help`` line."""
    value: str = ""
    """How a value is written in the docs' option column (``N``, ``SIZE|auto``); "" for a flag."""
    doc: str = ""
    """The docs table's meaning where it says more than ``help``."""
    shown: str | None = None
    """The docs table's default; None: the default itself."""
    short: str = ""
    """A one-letter alias (``-n``)."""
    text: Callable[[str], Any] | None = None
    """Reads the command line's text into the field's value, for a value that is not that text
    (``--threads auto`` is None); the command line then takes text, default ``text_default``."""
    text_default: str | None = None
    check: Callable[[str, Any], None] | None = None
    """Raises ConfigError for a value the option cannot take: (flag, value)."""
    env: str = ""
    """The variable each job gets from it, where there is one."""
    ray: bool = False
    """``memgov ray pack`` takes it too (``ray_default``, ``ray_help``: where Ray's differ)."""
    ray_default: Any = SAME
    ray_help: str = ""
    ray_check: Callable[[str, Any], None] | None = None
    """The check where Ray's bound differs (a cluster runs more jobs than one GPU)."""


def option(default: Any, help: str, **spec: Any) -> Any:
    """A field of PackConfig that is an option (see :class:`Option` for ``spec``)."""
    meta = {"option": Option(help=help, **spec)}
    if isinstance(default, list):
        return field(default_factory=list, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class Described:
    """One option as the front ends see it: the field's name, type and default, and its Option."""

    name: str
    type: Any
    default: Any
    spec: Option
    front: str = "pack"

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def text_default(self) -> str | None:
        """The command line's default, for an option that takes text."""
        if self.front == "ray" and self.spec.ray_default is not SAME:
            return str(self.spec.ray_default)  # Ray's own, e.g. --threads 1
        return self.spec.text_default


# -- the checks an option names in its row --------------------------------------------------------


def _choice(*accepted: str) -> Callable[[str, Any], None]:
    def check(flag: str, value: Any) -> None:
        if value not in accepted:
            raise ConfigError(f"{flag} {value!r}: accepted {', '.join(accepted)}")

    return check


def _count(most: int) -> Callable[[str, Any], None]:
    def check(flag: str, value: Any) -> None:
        if value is None:
            return
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
            raise ConfigError(f"{flag} {value!r}: accepted a whole number from 1 to {most}")

    return check


def _sweep(flag: str, value: list[int] | None) -> None:
    if value is None:
        return
    if not value:
        raise ConfigError(f"{flag}: accepted a comma-separated list of job counts, e.g. 1,8,25")
    for n in value:
        _count(MAX_JOBS)(flag, n)


def _claim(flag: str, value: str) -> None:
    if value.strip().lower() != "auto":
        Size(value, flag, also=CLAIM_ALSO)


def _host_per_job(flag: str, value: str) -> None:
    if value.strip().lower() not in ("auto", "off"):
        Size(value, flag, also="auto (recorded host peaks) or off").on(None)


def _timeout(flag: str, value: float | None) -> None:
    if value is not None and not value > 0:
        raise ConfigError(f"{flag} {value}: accepted seconds > 0")


def _wait(flag: str, value: float | None) -> None:
    _settings.wait_seconds(value, flag)  # the rule of MEMGOV_WAIT, which it sets


def threads_text(text: str) -> int | None:
    """``--threads``: auto (None: memgov's thread budget decides in each job) or a number."""
    if text.strip().lower() == "auto":
        return None
    if not text.strip().isdigit() or int(text) < 1:
        raise ConfigError(f"--threads {text!r}: accepted auto or a whole number >= 1")
    return int(text)


def parse_sweep(text: str) -> list[int]:
    items = [t.strip() for t in text.split(",")]
    if not items or not all(t.isdigit() and int(t) >= 1 for t in items):
        raise ConfigError(
            f"--sweep {text!r}: accepted comma-separated job counts >= 1, e.g. 1,8,25,48"
        )
    return [int(t) for t in items]


def parse_rogue(text: str) -> tuple[int, int]:
    count, sep, mib = text.partition(":")
    if not sep or not count.strip().isdigit() or not mib.strip().isdigit():
        raise ConfigError(
            f"--rogue {text!r}: accepted K:MIB, e.g. 1:4096 (the last K jobs "
            "also allocate MIB MiB on the GPU after their first step)"
        )
    return int(count), int(mib)


def _words(text: str) -> list[str]:
    import shlex

    return shlex.split(text)


# -- the table ------------------------------------------------------------------------------------


@dataclass
class PackConfig:
    """A pack's request; each field after the first is an option (see the module's docstring)."""

    experiment: str | Path
    """A folder with an experiment.toml (or the file), or the name of a bundled experiment (see
    :data:`EXPERIMENT_DOC`)."""
    n: int = option(
        2,
        "Jobs to pack.",
        value="N",
        doc="jobs",
        short="-n",
        check=_count(MAX_JOBS),
        ray=True,
        ray_help="Jobs to run.",
        ray_check=_count(MAX_COUNT),
    )
    sweep: list[int] | None = option(
        None,
        "Several job counts, e.g. 1,8,25: one run each, plotted against N.",
        value="1,8,25",
        doc="one run per job count, plotted against N",
        text=parse_sweep,
        check=_sweep,
        shown="",
    )
    mode: str = option(
        "claim",
        "greedy (framework defaults: the study), growth, or claim (a budget per job).",
        doc="`greedy`, `growth` or `claim` (below)",
        check=_choice(*MODES),
    )
    claim: str = option(
        "auto",
        "Budget per job in claim mode: a size (1GiB, 900MiB) or auto (measured peak + "
        "margin; a default without history).",
        value="SIZE|auto",
        doc="budget per job in claim mode (below)",
        check=_claim,
        env="MEMGOV_CLAIM",
        ray=True,
        ray_default="1GiB",
        ray_help="GPU memory per job, e.g. 1GiB, or auto.",
    )
    framework: str = option(
        "torch",
        "torch, tensorflow or jax (the manifest's).",
        doc="a `[frameworks.X]` table of the manifest",
        ray=True,
        ray_help="torch, tensorflow or jax.",
    )
    epochs: int | None = option(
        None,
        "Epochs per job (manifest default).",
        value="N",
        shown="manifest's",
        doc="epochs per job",
        check=_count(MAX_COUNT),
        ray=True,
    )
    batch: int | None = option(
        None,
        "Batch size (manifest default).",
        value="N",
        shown="manifest's",
        doc="batch size",
        check=_count(MAX_COUNT),
        ray=True,
    )
    mps: str = option(
        "auto",
        "auto (when the machine has MPS), on, off.",
        value="auto|on|off",
        doc="MPS when the machine has it; `on` fails if it cannot",
        check=_choice(*MPS_CHOICES),
    )
    mps_daemons: int | None = option(
        None,
        "MPS control daemons (each admits MEMGOV_MPS_CLIENTS clients per GPU, 48 by "
        "default); default: as many as the jobs at once need.",
        value="N",
        shown="as needed",
        doc="MPS control daemons (each admits 48 clients per GPU); default: enough for the jobs "
        "at once",
        check=_count(MAX_MPS_DAEMONS),
    )
    runner: str = option(
        "auto",
        "auto (process, or preload when the jobs at once would not fit the host's memory "
        "as processes), process, namespace (own PID namespace; root), docker, or preload (jobs "
        "forked from one process that imported the framework once: less host memory and "
        "start-up CPU per job).",
        doc="`auto`, `process`, `namespace`, `docker`, `preload` (below)",
        check=_choice(*RUNNER_CHOICES),
    )
    image: str = option(
        DOCKER_IMAGE,
        "Image for --runner docker (examples/docker).",
        value="IMAGE",
        doc="the image for `--runner docker` (examples/docker)",
    )
    device: str = option(
        "gpu",
        "gpu, or cpu (a small run for CI and laptops: a simulated GPU for the ledger).",
        value="gpu|cpu",
        doc="`cpu`: a small run for CI and laptops (below)",
        check=_choice(*DEVICES),
        ray=True,
        ray_help="gpu, or cpu (simulated GPUs, CI).",
    )
    gpu: str | None = option(
        None,
        "Which GPU: index or UUID (default: first).",
        value="INDEX|UUID",
        shown="first visible",
        doc="the GPU to pack",
    )
    threads: int | None = option(
        None,
        "CPU threads per job: auto (cores / jobs at once) or a number.",
        value="auto|N",
        doc="CPU threads per job: auto = each job's share from memgov's thread budget "
        "(docs/threads.md), steady `max(1, cores // jobs at once)`; N = `MEMGOV_THREADS=N`",
        text=threads_text,
        text_default="auto",
        shown="auto",
        check=_count(MAX_COUNT),
        env="MEMGOV_THREADS",
        ray=True,
        ray_default=1,
        ray_help="CPU threads (and Ray CPUs) per job: a number, or auto.",
    )
    parallel: int | None = option(
        None,
        "Jobs at once (default all that the GPU's client or context limit takes; the rest queue).",
        value="K",
        shown="all",
        doc="jobs at once (capped by MPS clients or, without "
        "MPS, CUDA contexts); the rest start as others finish",
        check=_count(MAX_COUNT),
    )
    wait: float | None = option(
        None,
        "Jobs queue up to SECONDS for their budget (MEMGOV_WAIT) instead of failing.",
        value="S",
        shown="none",
        doc="jobs queue up to S seconds for their budget (`MEMGOV_WAIT`) instead of failing",
        check=_wait,
        env="MEMGOV_WAIT",
        ray=True,
    )
    timeout: float | None = option(
        None,
        "Stop a run's jobs after SECONDS.",
        value="S",
        shown="none",
        doc="stop a run's jobs after S seconds (reason `timeout`; their finished epochs still "
        "count)",
        check=_timeout,
        ray=True,
        ray_help="Stop a job after SECONDS.",
    )
    baseline: str = option(
        "none",
        "naive: first run the same N greedy (no thread or MPS governance), side by side.",
        value="naive",
        doc="first the same N greedy (no thread or MPS governance), side by side",
        check=_choice(*BASELINES),
    )
    baseline_args: list[str] = option(
        [],
        "Extra trainer arguments for the baseline only, e.g. '--limit 2000'.",
        value='"..."',
        doc="trainer arguments for the baseline only (it is much slower)",
        text=_words,
        text_default="",
        shown="",
    )
    solo: bool = option(
        True,
        "Run one job alone first (slowdown, speedup).",
        shown="solo",
        doc="one job alone first: the reference for slowdown and speedup",
    )
    rogue: tuple[int, int] | None = option(
        None,
        "K:MIB: the last K jobs also allocate MIB MiB after their first step.",
        value="K:MIB",
        shown="",
        text=parse_rogue,
        doc="the last K jobs also allocate MIB MiB "
        "after their first step (`[experiment] rogue_args`, default `--hog-mib {mib}`)",
    )
    host_per_job: str = option(
        "auto",
        "Host memory one job needs: SIZE, auto (recorded peaks; 2GiB before any) or off. "
        "A job starts only when the host can hold it; others wait.",
        value="SIZE|auto|off",
        doc="host memory one job needs; a job starts only when the host can hold it (below)",
        check=_host_per_job,
    )
    pin: bool = option(
        False,
        "Pin each job to its share of cores.",
        shown="off",
        doc="pin each job to its share of cores (the only lever on XLA's CPU thread pools)",
    )
    compile_cache: str = option(
        "auto",
        "JAX: one compilation cache for the jobs, warmed by one job before the others "
        "start: auto (a folder in the report folder), off, or a folder of your own.",
        value="auto|off|DIR",
        doc="JAX: one persistent compilation cache for the governed jobs, "
        "warmed by one warm-up job before a run's jobs start (below)",
    )
    history: bool = option(
        True,
        "Record measured peaks for --claim auto.",
        shown="history",
        doc="record measured peaks (`--no-history`: do not)",
    )
    python: str = option(
        sys.executable,
        "Interpreter for {python} in the manifest (default: the one running pack).",
        value="PATH",
        text=str,
        shown="pack's own",
        doc="the interpreter for `{python}` in the manifest (it needs the experiment's framework)",
    )
    out: Path | None = option(
        None,
        "Report folder (default pack-results/...).",
        value="DIR",
        shown="`pack-results/<name>-<fw>-<mode>-n<N>-<time>-<pid>`",
        doc="report folder",
    )
    trainer_args: list[str] = field(default_factory=list)
    """Arguments after ``--``, for every job's trainer."""

    def check(self) -> None:
        """Raise ConfigError for anything pack cannot do, before any job starts."""
        check_options(self)
        if self.sweep is not None and self.baseline != "none":
            raise ConfigError("--baseline applies to a single --n, not to --sweep")
        if self.mode != "claim" and self.claim != "auto":
            raise ConfigError(
                f"--claim {self.claim} applies to --mode claim only "
                f"(--mode {self.mode} claims no budget)"
            )
        if self.mode == "greedy" and self.mps == "on":
            raise ConfigError(
                "--mode greedy runs the frameworks at their defaults, without MPS; "
                "accepted with it: --mps auto or off"
            )
        if self.device == "cpu" and self.mps == "on":
            raise ConfigError("--mps on needs a GPU; with --device cpu accepted: --mps auto/off")
        if self.device == "gpu" and _settings.is_set("MEMGOV_DEVICES"):
            raise ConfigError(
                "MEMGOV_DEVICES simulates GPUs, but --device gpu needs real ones: "
                "unset MEMGOV_DEVICES, or pack on CPU with --device cpu"
            )
        if self.rogue is not None:
            count, mib = self.rogue
            largest = max(self.sweep or [self.n])
            if not 1 <= count <= largest or mib < 1:
                raise ConfigError(
                    f"--rogue {count}:{mib}: accepted K:MIB with 1 <= K <= {largest}"
                    " jobs and MIB >= 1"
                )
        if self.baseline_args and self.baseline == "none":
            raise ConfigError("--baseline-args needs --baseline naive")
        if self.runner != "docker":  # docker jobs run the image's python
            check_python(self.python)


def check_framework(python: str, framework: str) -> None:
    """Refuse an interpreter without the framework memgov has an adapter of by that name, before
    any job starts: each would fail at its import otherwise."""
    from memgov._base import importhook as _importhook

    if framework not in _importhook.frameworks():
        return  # an experiment's own framework name: its jobs say what they miss
    probe = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({framework!r}) is None)"
    try:
        found = subprocess.run([python, "-c", probe], capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(f"--python {python!r}: cannot run it ({exc})") from None
    if found.returncode != 0:
        raise ConfigError(
            f"--framework {framework}: {python} cannot import {framework}; accepted an "
            f"interpreter that has it (--python), or install it there (docs/pack.md)"
        )


EXPERIMENT_DOC = (
    "a folder with an `experiment.toml` (or the file), or the name of a bundled experiment "
    "(`mnist`: installed with memgov, so it works outside a clone; a folder of that name in the "
    "working directory wins)"
)


def options(front: str = "pack") -> Iterator[Described]:
    """The options of ``front``: ``pack`` (every option) or ``ray`` (those memgov ray pack takes,
    with its defaults)."""
    import typing

    types = typing.get_type_hints(PackConfig)
    for item in dataclasses.fields(PackConfig):
        spec = item.metadata.get("option")
        if spec is None or (front == "ray" and not spec.ray):
            continue
        default = [] if item.default is dataclasses.MISSING else item.default
        if front == "ray" and spec.ray_default is not SAME:
            default = spec.ray_default
        yield Described(item.name, types[item.name], default, spec, front)


def check_options(cfg: PackConfig, front: str = "pack") -> None:
    """Each option's own check (no rule between options): what ``memgov ray pack`` asks."""
    for described in options(front):
        spec = described.spec
        check = spec.ray_check if front == "ray" and spec.ray_check else spec.check
        if check is not None:
            check(described.flag, getattr(cfg, described.name))


def check_python(python: str) -> None:
    """Refuse an interpreter that cannot start, before any job or report exists."""
    found = shutil.which(python) if os.sep not in python else python
    if found is None or not os.path.isfile(found) or not os.access(found, os.X_OK):
        if found is None:
            where = "not found on PATH"
        elif not os.path.exists(found):
            where = "no such file"
        else:
            where = "not an executable file"
        raise ConfigError(
            f"--python {python!r}: {where}; accepted the path (or a name on PATH)"
            " of a Python interpreter that has the experiment's framework"
        )


def report_folder(out: Path) -> Path:
    """Make the report folder (and its parents); a clear error where that cannot be done."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise ConfigError(
            f"--out {out}: a file of that name is in the way; accepted a folder "
            "path (it is created if missing)"
        ) from None
    except OSError as exc:
        raise ConfigError(
            f"--out {out}: cannot create the report folder "
            f"({exc.strerror or exc}); accepted a folder you can write"
        ) from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise ConfigError(
            f"--out {out}: the folder is not writable; accepted a folder you can write"
        )
    return out


def cores() -> int:
    return len(os.sched_getaffinity(0))


def threads_for(cfg: PackConfig, concurrent: int) -> int:
    return cfg.threads or max(1, cores() // max(1, concurrent))


def cpu_sets(index: int, threads: int) -> set[int]:
    """The cores job ``index`` is pinned to with --pin: consecutive blocks, wrapping around."""
    allowed = sorted(os.sched_getaffinity(0))
    start = (index * threads) % len(allowed)
    return {allowed[(start + k) % len(allowed)] for k in range(min(threads, len(allowed)))}


def markdown() -> str:
    """docs/pack.md's option table: the experiment and every option, as `memgov pack` spells
    them (tests/pack/test_pack_options.py compares them)."""
    rows = [
        "| option | default | meaning |",
        "|---|---|---|",
        _row("`EXPERIMENT`", "", EXPERIMENT_DOC),
    ]
    for described in options("pack"):
        meaning = described.spec.doc or described.spec.help
        rows.append(_row(_shown_flag(described), _shown_default(described), meaning))
    return "\n".join(rows) + "\n"


def _row(*cells: str) -> str:
    return "| " + " | ".join(cells).replace("|  |", "| |") + " |"


def _shown_flag(described: Described) -> str:
    if described.type is bool:
        return f"`{described.flag}/--no-{described.flag[2:]}`"
    value = f" {described.spec.value}" if described.spec.value else ""
    return f"`{described.flag}{value}`".replace("|", "\\|")


def _shown_default(described: Described) -> str:
    if described.spec.shown is not None:
        return described.spec.shown
    return "" if described.default is None else str(described.default)


if __name__ == "__main__":  # python -m memgov.pack.config: the docs' table
    print(markdown(), end="")
