"""Hard or soft: whether the GPU driver enforces a claim, decided before its record is written.

Hard mode uses MPS's per-client pinned device-memory limit (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT).
The driver reads it when CUDA initialises in the process and then refuses any allocation past it,
CUDA context included (measured: docs/hard-limits.md), so a claim can be hard only while
CUDA is not yet initialised here, and only if an MPS daemon will take this process as a client.
The frameworks' own caps stay on inside it (soft inside hard), so the framework raises its clean
OutOfMemoryError before the driver refuses.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from memgov._base import settings as _settings
from memgov._base.errors import ConfigError
from memgov._gpu.devices import Device

PIN_ENV = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
THREADS_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
LOG_ENV = "CUDA_MPS_LOG_DIRECTORY"
MARK_ENV = "MEMGOV_MPS_LIMIT"
"""The pinned limit memgov itself set: a child may replace it, but never one set by someone else."""
MIB = 2**20


@dataclass(frozen=True)
class Plan:
    """What this process's claim can get, whichever device admission picks."""

    hard: bool
    reason: str
    """Why the claim is soft, or which daemon makes it hard."""
    pipe: Path | None = None
    memgov_daemon: bool = False
    """The daemon is memgov's own: claim() must point CUDA at its pipe folder."""
    daemons: tuple[int, ...] = ()
    """memgov's daemons this claim may join (by number); admission picks one with room."""

    def mode(self, device: Device, compute: int | None = None) -> tuple[str, str]:
        """("hard" | "soft", reason) for a claim on ``device``."""
        if device.simulated:
            mode, reason = "soft", "simulated device: no driver to enforce a limit"
        else:
            mode, reason = ("hard" if self.hard else "soft"), self.reason
        if compute is not None and mode == "soft":
            reason += f"; compute={compute}% not applied (it needs MPS)"
        return mode, reason


def check_compute(compute: object) -> int | None:
    """``claim(compute=...)``: None, or the whole percentage of the GPU's SMs, 1 to 100."""
    if compute is None:
        return None
    if isinstance(compute, bool) or not isinstance(compute, int) or not 1 <= compute <= 100:
        raise ConfigError(
            f"compute={compute!r}: accepted None (no SM limit) or a whole percentage of the "
            "GPU's SMs from 1 to 100 (MPS active-thread percentage; needs hard mode)"
        )
    return compute


def decide(candidates: Sequence[Device], cuda_initialized: bool) -> Plan:
    """Hard iff an MPS daemon will take this process and CUDA is not initialised in it yet.

    Cheap checks first: on simulated devices, or with CUDA already up, no MPS program is run.
    """
    setting = _settings.get("MEMGOV_MPS")
    if all(d.simulated for d in candidates):
        return Plan(False, "simulated device: no driver to enforce a limit")
    if setting == "off":
        return Plan(False, "MEMGOV_MPS=off")
    if cuda_initialized:
        return Plan(
            False,
            "CUDA already initialised in this process; the driver reads the MPS "
            "limit only when CUDA starts",
        )
    preset = os.environ.get(PIN_ENV)
    if preset and preset != os.environ.get(MARK_ENV):
        return Plan(
            False,
            f"{PIN_ENV}={preset!r} was set outside memgov; memgov does not "
            "replace a limit it did not set",
        )
    from memgov._gpu import mpsctl as _mpsctl

    if _mpsctl.binary() is None:
        return Plan(
            False,
            f"{_mpsctl.CONTROL} is not on PATH, so memgov cannot reach or check an MPS daemon",
        )
    found = _mpsctl.client_daemons()
    if not found:
        where = os.environ.get(PIPE_ENV) or f"{_mpsctl.paths().pipe} or {_mpsctl.DEFAULT_PIPE}"
        return Plan(False, f"no MPS daemon reachable at {where} (`memgov mps start` runs one)")
    usable: list[tuple[int | None, Path]] = []
    foreign = ""
    for (index, pipe), uids in zip(found, _server_uids([pipe for _, pipe in found]), strict=True):
        others = {pid: uid for pid, uid in uids.items() if uid is not None and uid != os.getuid()}
        if not others:
            usable.append((index, pipe))
        elif not foreign:
            pid, uid = next(iter(others.items()))
            # MPS serves one user at a time: this client would wait at CUDA start-up until
            # every client of that server has ended.
            foreign = (
                f"the MPS server (pid {pid}) on {pipe} runs as uid {uid}, this process "
                f"as uid {os.getuid()}; MPS would hold it until that server's clients end"
            )
    if not usable:
        return Plan(False, foreign)
    index, pipe = usable[0]
    if index is None:
        return Plan(True, f"MPS pinned device-memory limit (daemon on {pipe})", pipe)
    numbers = tuple(k for k, _ in usable if k is not None)
    where = str(pipe) if len(numbers) == 1 else f"{len(numbers)} of memgov's daemons"
    return Plan(True, f"MPS pinned device-memory limit (daemon on {where})", pipe, True, numbers)


def _server_uids(pipes: list[Path]) -> list[dict[int, int | None]]:
    """Each daemon's servers and their users, asked of all daemons at once: with many jobs
    starting together a control daemon can take seconds to answer, and the waits would add up."""
    from memgov._gpu import mpsctl as _mpsctl

    if _mpsctl.servers_all_ours(pipes):
        return [{} for _ in pipes]  # nothing of another user's to find: no daemon asked
    if len(pipes) == 1:
        return [_mpsctl.server_uids(pipes[0])]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=len(pipes)) as pool:
        return list(pool.map(_mpsctl.server_uids, pipes))


def pinned_limit(size: int, index: int) -> str:
    """The CUDA_MPS_PINNED_DEVICE_MEM_LIMIT value: whole MiB, rounded down (never above budget).

    The index is the device's ordinal as the client sees it (after CUDA_VISIBLE_DEVICES).
    """
    return f"{index}={max(1, size // MIB)}M"


def apply(
    plan: Plan, size: int, index: int, compute: int | None, daemon: int | None = None
) -> dict[str, str | None]:
    """Set the hard limit in this process's environment; return the previous values to restore.

    ``daemon``: the memgov daemon admission picked; CUDA reads its pipe folder at start-up.
    """
    wanted = {PIN_ENV: pinned_limit(size, index)}
    wanted[MARK_ENV] = wanted[PIN_ENV]
    if compute is not None:
        wanted[THREADS_ENV] = str(compute)
    if plan.memgov_daemon and plan.pipe is not None:
        from memgov._gpu.mpsctl import paths

        where = paths(daemon if daemon is not None else (plan.daemons or (0,))[0])
        wanted[PIPE_ENV] = str(where.pipe)
        wanted[LOG_ENV] = str(where.log)
    previous = {name: os.environ.get(name) for name in wanted}
    os.environ.update(wanted)
    return previous


CLAIM_ENV = (PIN_ENV, MARK_ENV, THREADS_ENV, PIPE_ENV, LOG_ENV)
"""Every variable claim() may set here (with CUDA_VISIBLE_DEVICES): put back if it fails."""


def renumber_pinned(old_index: int | None) -> None:
    """CUDA_VISIBLE_DEVICES now shows only the claimed GPU, as ordinal 0: make an inherited
    pinned limit follow it, so it never names the GPU's former ordinal (or a now hidden GPU).

    The entry for ``old_index`` becomes "0=..."; entries of other GPUs are dropped, and the
    variable with them when none is left. A value whose ordinals cannot be read is left as is
    (the scheduler readers report it).
    """
    raw = os.environ.get(PIN_ENV)
    if old_index is None or raw is None or not raw.strip():
        return
    kept: list[str] = []
    for item in (i.strip() for i in raw.split(",")):
        if not item:
            continue
        ordinal, sep, limit = item.partition("=")
        if not sep or not ordinal.strip().isdigit():
            return
        if int(ordinal) == old_index:
            kept.append(f"0={limit.strip()}")
    new = ",".join(kept[-1:])  # the driver takes one limit per ordinal; like _schedulers, the last
    mark = os.environ.get(MARK_ENV) == raw  # memgov's own limit stays recognised as memgov's
    for name in (PIN_ENV, MARK_ENV) if mark else (PIN_ENV,):
        if new:
            os.environ[name] = new
        else:
            os.environ.pop(name, None)


def describe() -> str:
    """One line for Claim.reports: what this process's environment now asks of MPS."""
    text = f"mps: {PIN_ENV}={os.environ.get(PIN_ENV)} (driver-enforced, context included)"
    if os.environ.get(THREADS_ENV):
        text += f", {THREADS_ENV}={os.environ[THREADS_ENV]}"
    if os.environ.get(PIPE_ENV):
        text += f", daemon on {os.environ[PIPE_ENV]}"
    return text


def restore(previous: dict[str, str | None]) -> None:
    """Undo :func:`apply`, so a child started after release gets no stale limit."""
    for name, value in previous.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def client_limit_reason(hard_clients: int, mode: str, device: str) -> str | None:
    """Why a hard claim cannot join a single MPS server on ``device``, or None when it can."""
    if mode != "hard":
        return None
    from memgov._gpu.mpsctl import client_limit

    limit = client_limit()
    if hard_clients < limit:
        return None
    return (
        f"MPS client limit {limit} reached on {device} ({hard_clients} hard-mode claims; "
        "MEMGOV_MPS_CLIENTS sets the limit)"
    )


def pick_daemon(
    by_daemon: Mapping[int, int], daemons: Sequence[int], device: str
) -> tuple[int | None, str | None]:
    """(the daemon a hard claim joins, None) or (None, why none has room) on ``device``.

    ``by_daemon``: live hard claims on the device per daemon number (the ledger's count).
    Policy (MEMGOV_MPS_POLICY): ``fill`` takes the lowest-numbered daemon with room, ``spread``
    the one with the fewest clients (the lowest number on a tie).
    """
    from memgov._gpu.mpsctl import client_limit, policy

    limit = client_limit()
    room = [k for k in daemons if by_daemon.get(k, 0) < limit]
    if room:
        if policy() == "spread":
            return min(room, key=lambda k: (by_daemon.get(k, 0), k)), None
        return min(room), None
    counts = ", ".join(f"daemon {k}: {by_daemon.get(k, 0)}" for k in daemons)
    return None, (
        f"MPS client limit {limit} reached on {device} on every running daemon "
        f"({counts} hard-mode claims); `memgov mps start --daemons N` runs more, "
        "MEMGOV_MPS_CLIENTS sets the limit per daemon"
    )


def context_limit_reason(contexts: int, mode: str, device: Device) -> str | None:
    """Why a claim without MPS cannot get a CUDA context on ``device`` now, or None."""
    if mode == "hard":
        return None  # MPS clients are the server's, counted by pick_daemon
    from memgov._base import config as _config

    limit = _config.context_limit(device.simulated)
    if limit is None or contexts < limit:
        return None
    return (
        f"CUDA context limit {limit} reached on {device.uuid} ({contexts} claims without "
        "MPS; past it CUDA fails at start-up with 'out of memory' while memory is free; "
        "MEMGOV_CONTEXTS sets the limit, MPS lifts it)"
    )
