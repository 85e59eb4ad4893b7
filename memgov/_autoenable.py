"""Auto-enable: govern an unchanged ``python train.py`` from environment variables alone.

``memgov-autoenable.pth`` (installed into site-packages, see setup.py) calls :func:`start` at
interpreter start-up only when MEMGOV_CLAIM or a GPU scheduler's budget variable is set. start()
registers import hooks and nothing else: pip and every Python program that imports no GPU
framework are left alone. The frameworks are those with an adapter registered (their entry points'
names: memgov._base.importhook.frameworks()). When the first ``import torch`` / ``tensorflow`` /
``jax`` (or another registered framework's) begins, before
the framework's code runs, the CPU share is decided, so the thread variables are set before the
libraries that read them load (numpy's OpenBLAS starts one thread per core at load otherwise:
docs/threads.md). When that import has succeeded, the budget is claimed and the adapters applied,
before the framework initialises the GPU: an import that fails (an optional framework probed
with ``try: import jax``) claims nothing. From the import's start to its end the collector is
paused, and the objects alive at its end are frozen (MEMGOV_GC_FREEZE: memgov/_collector.py).

Auto mode never crashes the program: any failure prints one warning line and the program runs on
(with the no-greedy-preallocation defaults ``import memgov`` sets). MEMGOV_STRICT=1 turns the
failure into an exception raised from the framework's import statement.

Module-level imports stay at os/sys: this module is imported at start-up.
"""

from __future__ import annotations

import os
import sys
import threading
from types import ModuleType
from typing import TYPE_CHECKING, Any

# At module level, not in the import hook: compiling it there, at the framework import's start,
# made the collections the pause is there to avoid.
from memgov import _collector

if TYPE_CHECKING:
    from memgov._gpu.devices import Device

PTH_NAME = "memgov-autoenable.pth"
"""Its line (setup.py writes it) is memgov._base.settings.pth_line(): it wakes auto-enable when one
of memgov._base.settings.TRIGGERS is set (MEMGOV_CLAIM or a GPU scheduler's budget variable)."""

_lock = threading.Lock()
_state: dict[str, Any] = {"started": False, "fired": False}
outcome: dict[str, Any] = {}
"""What auto-enable did in this process (mode, source, claim, reports, warnings), for tests and
``memgov doctor``."""


def _fresh_lock_in_child() -> None:
    # A lock held at fork() time (a thread importing a framework) stays held in the forked
    # child, where that thread does not exist: the child's first use would wait forever.
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_fresh_lock_in_child)


def triggered(environ: Any = None) -> bool:
    from memgov._base.settings import TRIGGERS

    env = os.environ if environ is None else environ
    return any(key.startswith(TRIGGERS) for key in env)


def start() -> None:
    """Install the import hooks. Called by the .pth line; never raises."""
    try:
        with _lock:
            if _state["started"]:
                return
            _state["started"] = True
        from memgov._base import importhook as _importhook

        for name in _importhook.frameworks():
            _hook(name)
    except Exception as exc:  # a start-up hook must never stop the interpreter
        _warn(f"auto-enable could not start: {type(exc).__name__}: {exc}")


def start_preloaded(preloaded: list[ModuleType]) -> None:
    """:func:`start` in a process whose ``preloaded`` frameworks were imported before it (a job
    forked by pack's preload zygote, memgov/pack/_forked.py): hooks for the other frameworks, and
    the preloaded ones governed now. Unlike start(), errors propagate (a refusal under
    MEMGOV_STRICT=1 is raised from the job's import statement that called this)."""
    with _lock:
        _state["started"] = True
    from memgov._base import importhook as _importhook

    names = {module.__name__ for module in preloaded}
    for name in _importhook.frameworks():
        if name not in names:
            _hook(name)
    for module in preloaded:
        _on_import(module)


def _hook(name: str) -> None:
    """Govern the framework ``name`` when its first import begins and ends."""
    from memgov._base import importhook as _importhook

    _importhook.when_importing(name, _threads_first, _import_failed)
    _importhook.when_imported(name, _on_import)


class Settings:
    """The settings auto mode acts on, parsed by memgov._base.settings (a plain class: dataclasses
    imports inspect, slow)."""

    def __init__(
        self,
        claim: Any,
        device: str | None,
        wait: float | None,
        strict: bool,
        quiet: bool,
        threads: Any,
    ) -> None:
        self.claim = claim
        """None (unset: scheduler budgets decide), "growth", "auto", "off" or a checked
        memgov._base.sizes.Size (named MEMGOV_CLAIM in its errors)."""
        self.device = device
        self.wait = wait
        self.strict = strict
        self.quiet = quiet
        self.threads = threads
        """MEMGOV_THREADS parsed (memgov._base.settings.Threads)."""


def strict_mode() -> bool:
    """MEMGOV_STRICT; garbage in it warns (not strict: auto mode must not crash the program)."""
    from memgov._base import settings as _settings

    try:
        return bool(_settings.get("MEMGOV_STRICT"))
    except ValueError as exc:
        _warn(str(exc))
        return False


def read_settings(strict: bool) -> Settings:
    """The settings, after checking every user setting in the table, those this run would not
    use too (a typo shows now, not on the day the setting matters); raises ConfigError naming
    each variable memgov cannot use and the forms it accepts."""
    from memgov._base import settings as _settings
    from memgov._base.errors import ConfigError

    values, problems = _settings.read_all(skip=("MEMGOV_STRICT",))  # strict_mode() read it
    if problems:
        raise ConfigError("; ".join(problems))
    return Settings(
        values["MEMGOV_CLAIM"],
        values["MEMGOV_DEVICE"],
        values["MEMGOV_WAIT"],
        strict,
        values["MEMGOV_QUIET"],
        values["MEMGOV_THREADS"],
    )


def auto_size(device: Device) -> tuple[int, str] | None:
    """A GPU scheduler's budget for MEMGOV_CLAIM unset: (bytes, where it came from), or None
    (growth); its variables' problems warn (strict: raise). ``auto`` goes further (a profile,
    a first run): memgov/_profiles/autosize.py."""
    from memgov._gpu import schedulers as _schedulers

    reading = _schedulers.read(device.total, device.visible_index)
    _report_problems(reading.problems)
    chosen = reading.chosen
    return None if chosen is None else (chosen.bytes, chosen.source)


def _threads_first(module: ModuleType) -> None:
    """As a framework's import begins: this process's CPU share, decided as the claim at the
    import's end would decide it (it reuses this decision), so that the thread variables are set
    before the libraries the import loads read them; and, with MEMGOV_GC_FREEZE on, the
    collector paused until the import's end (memgov/_collector.py). Never raises: whatever is
    wrong with the settings, the claim at the import's end says (or, strict, raises)."""
    with _lock:
        if _state["fired"]:
            return
    name = module.__name__
    # Paused while memgov decides (its own new objects would otherwise bring a full collection),
    # then kept paused through the import if it is to be frozen at its end.
    _collector.pause(name)
    keep = False
    try:
        keep = _decide_threads()
    except Exception as exc:  # the claim at the import's end meets it again and says so
        outcome.setdefault("threads_first", f"{type(exc).__name__}: {exc}")
    finally:
        if not keep:
            _collector.resume(name)


def _decide_threads() -> bool:
    """Decide the share; whether the collector stays paused through the import (auto-enable
    governs it and MEMGOV_GC_FREEZE is on)."""
    from memgov import _claim
    from memgov._base import settings as _settings
    from memgov._cpu import threads as _threads

    if _claim.current() is not None:
        return False  # the program claimed itself: its claim decided the share
    values, problems = _settings.read_all(skip=("MEMGOV_STRICT",))
    if problems or values["MEMGOV_CLAIM"] == "off":
        return False
    _threads.govern(values["MEMGOV_THREADS"], inherited=parent_holder() is not None)
    return bool(values["MEMGOV_GC_FREEZE"])


def _import_failed(module: ModuleType) -> None:
    """A framework's import raised: nothing of it to freeze; the collector as it was."""
    _collector.resume(module.__name__)


def _on_import(module: ModuleType) -> None:
    governed = False
    try:
        governed = _govern_once(module)
    finally:
        # Frozen only at the end of the import that auto-enable governed, once it went through
        # (a strict refusal fails the import): not at a later or overlapping framework import's
        # end, which would freeze what the program made meanwhile.
        _collector.resume(module.__name__, freeze=governed)
        if _collector.frozen:
            outcome["gc_frozen"] = _collector.frozen


def _govern_once(module: ModuleType) -> bool:
    """Govern at the first framework import's end; whether this call did (False: fired
    before). Raises only under MEMGOV_STRICT=1."""
    with _lock:
        if _state["fired"]:
            return False
        _state["fired"] = True
    strict = strict_mode()
    outcome["strict"] = strict
    try:
        with _collector.Paused():
            _govern(module.__name__, strict)
    except Exception as exc:
        from memgov._base.errors import MemgovError

        outcome["error"] = f"{type(exc).__name__}: {exc}"
        if strict:
            if isinstance(exc, MemgovError):
                raise
            raise MemgovError(f"auto-enable failed: {type(exc).__name__}: {exc}") from exc
        detail = str(exc) if isinstance(exc, MemgovError) else f"{type(exc).__name__}: {exc}"
        _warn_once_per_job(
            f"{detail}; continuing without a memgov budget (MEMGOV_STRICT=1 or memgov run "
            "--strict makes this an error)"
        )
    return True


def _govern(framework: str, strict: bool) -> None:
    from memgov import _claim
    from memgov._gpu import devices as _devices

    if _claim.current() is not None:
        outcome["mode"] = "explicit"  # the program called memgov.claim() itself, first
        return
    settings = read_settings(strict)
    outcome["settings"] = settings
    holder = parent_holder()
    if holder is not None:
        # A child of a governed process (DataLoader worker, multiprocessing, subprocess): the
        # parent's claim covers the job; a second claim would count it twice.
        outcome.update(mode="child", parent=holder)
        _growth(settings, "inherited from a parent that holds a claim", quiet=True)
        return
    if settings.claim == "off":
        outcome["mode"] = "off"
        return
    if settings.claim == "growth":
        _growth(settings, "MEMGOV_CLAIM=growth", quiet=settings.quiet)
        return
    size: int | str
    device_arg: str | int | None = None
    if settings.claim is None:
        # Unset (a scheduler's variable woke auto-enable): its budget, else growth.
        device = _devices.candidates(settings.device)[0]
        found = auto_size(device)
        if found is None:
            why = "no GPU scheduler budget in the environment"
            _growth(settings, f"MEMGOV_CLAIM=unset: {why}", settings.quiet)
            return
        size, source = found
        device_arg = device.uuid
    elif settings.claim == "auto":
        # claim() sizes it (scheduler, profile, first run: memgov/_profiles/autosize.py) and says
        # how; read here first so that a scheduler variable's garbage warns (or, strict, raises).
        auto_size(_devices.candidates(settings.device)[0])
        size, source = "auto", "MEMGOV_CLAIM=auto"
    else:
        size, source = settings.claim, f"MEMGOV_CLAIM={settings.claim}"
    held = _claim.claim(size, device=device_arg or _device_arg(settings.device), wait=settings.wait)
    outcome.update(mode="claim", source=source, claim=str(held), reports=held.reports)
    if not settings.quiet:
        _say(f"{held} [{source}; at import {framework}]")
        if held.admission_s >= SLOW_ADMISSION_S and "admission" in held.reports:
            _say(held.reports["admission"])  # where a slow start went; quick ones stay quiet
        _print_reports(held.reports)


def _device_arg(raw: str | None) -> str | int | None:
    if raw is None:
        return None
    from memgov._base.errors import ConfigError, NoDeviceError
    from memgov._gpu import devices as _devices

    try:
        _devices.candidates(raw)
    except (ConfigError, NoDeviceError) as exc:
        raise ConfigError(f"MEMGOV_DEVICE={raw!r}: {exc}") from None
    return raw


def _growth(settings: Settings, why: str, quiet: bool) -> None:
    """No cap and no claim: frameworks only stop preallocating the whole GPU."""
    from memgov import _adapters
    from memgov._cpu import threads as _threads

    reports: dict[str, str] = {}
    outcome.update(mode=outcome.get("mode", "growth"), source=why, reports=reports)
    threads = _threads.govern(settings.threads, inherited=outcome.get("mode") == "child")
    line = _threads.report(threads)
    if line:
        reports["threads"] = line
    budget = _adapters.Budget(
        bytes=None,
        device_uuid="",
        device_total=0,
        device_index=None,
        simulated=False,
        name="growth",
        threads=threads.threads,
    )
    _adapters.govern(budget, reports)
    if not quiet:
        _say(f"growth only, no budget claimed ({why})")
        _print_reports(reports)


SLOW_ADMISSION_S = 0.5
"""Auto-enable prints the admission line (lock wait, NVML time) of claims at least this slow."""


def _print_reports(reports: dict[str, str]) -> None:
    """Print each adapter's report once it has applied (now, or when its framework is imported)."""
    from memgov import _adapters
    from memgov._base import importhook as _importhook

    if "threads" in reports:
        _say(reports["threads"])
    for adapter in _adapters.available():

        def show(_module: object, name: str = adapter.name) -> None:
            if name in reports:
                _say(reports[name])

        # Registered after govern()'s own hook for the module, so it runs after the adapter.
        _importhook.when_imported(adapter.module, show)


def parent_holder() -> str | None:
    """MEMGOV_HOLDER where it names a live claim (a governed parent's: this process is its child,
    covered by that claim), else None."""
    from memgov._claim import HOLDER_ENV

    holder = os.environ.get(HOLDER_ENV, "")
    return holder if holder and holder_alive(holder) else None


def holder_alive(value: str) -> bool:
    """Whether MEMGOV_HOLDER names a claim record whose holder still holds its lock."""
    from memgov._ledger.ledger import claim_alive

    uuid, _, record = value.partition("/")
    return bool(uuid) and claim_alive(uuid, record)


def _report_problems(problems: list[str]) -> None:
    if not problems:
        return
    from memgov._base.errors import ConfigError

    if outcome.get("strict"):
        raise ConfigError("; ".join(problems))
    _warn("; ".join(problems) + "; those variables are ignored")


def installed_pth() -> list[str]:
    """Where this interpreter has the auto-enable .pth file (empty: auto-enable not installed)."""
    import site

    folders = list(site.getsitepackages())
    if site.ENABLE_USER_SITE:
        folders.append(site.getusersitepackages())
    return [p for p in (os.path.join(f, PTH_NAME) for f in folders) if os.path.isfile(p)]


def _say(message: str) -> None:
    sys.stderr.write(f"memgov: {message}\n")
    sys.stderr.flush()


WARNED_ENV = "MEMGOV_WARNED"
"""A digest of the failure auto-enable last warned about in this job; children inherit it."""


def _warn_once_per_job(message: str) -> None:
    """Warn, unless a parent of this process (spawned DataLoader workers, multiprocessing,
    subprocesses: they inherit its environment, so they fail the same way) said just this."""
    import zlib

    mark = f"{zlib.crc32(message.encode()):08x}"
    if os.environ.get(WARNED_ENV) == mark:
        outcome.setdefault("warnings", []).append(message)  # said once, by the parent
        return
    os.environ[WARNED_ENV] = mark
    _warn(message)


def _warn(message: str) -> None:
    outcome.setdefault("warnings", []).append(message)
    _say(f"warning: {message}")
