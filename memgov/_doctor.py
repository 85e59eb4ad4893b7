"""`memgov doctor`: what memgov sees in this environment, and what it would do.

Reads only: no claim, no framework import (versions come from package metadata), NVML only
through memgov._gpu.nvml. Every check catches its own failure, so a broken part is reported, not
fatal.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from memgov._base.errors import MemgovError

ENV_SHOWN = ("CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "CUDA_MPS_PIPE_DIRECTORY")
"""Other programs' variables doctor shows beside memgov's own (every row of the settings table)
and the frameworks' (their adapters' facts)."""
PRIVATE_FS = ("overlay", "tmpfs", "aufs", "fuse-overlayfs")
"""File systems of a container's own root or scratch space: a ledger there is the container's,
unless the mount is a folder bound from elsewhere (its root is not the file system's own)."""
MEMORY_FS = ("tmpfs", "ramfs")
"""File systems with no journal or write-back: beside another user's flood of files there, claim
p99 1.4-1.5x its clean figure, against 3.0-3.2x on ext4 (docs/ledger.md, "Floods")."""


def diagnose() -> dict[str, Any]:
    from memgov import __version__, _autoenable
    from memgov._base import settings as _settings

    devices, device_problem = _devices()
    first = next((d for d in devices if d.get("visible_index") is not None), None)
    return {
        "memgov": __version__,
        "python": sys.executable,
        "auto_enable": {
            "installed": _autoenable.installed_pth(),
            "triggered": _autoenable.triggered(),
        },
        "nvml": _nvml(),
        "devices": devices,
        "devices_problem": device_problem,
        "frameworks": _frameworks(),
        "mps": _mps(),
        "budget": _budget(first),
        "ledger": ledger_sharing(),
        "ledger_problem": _ledger_problem(),
        "threads": _threads(),
        "views": views(),
        "settings": _settings.report(),
        **_environment(),
    }


def _environment() -> dict[str, Any]:
    """The variables doctor shows: those the user (or a scheduler) set, and apart, with the
    reason, those memgov set itself in a governed process this one descends from."""
    from memgov import _adapters
    from memgov._base import settings as _settings

    frameworks = [name for facts in _adapters.facts().values() for name in facts.env]
    names = (*_settings.names(), *ENV_SHOWN, *frameworks)
    shown = {k: os.environ[k] for k in names if k in os.environ}
    ours = set_by_memgov(os.environ)
    return {
        "environment": {k: v for k, v in shown.items() if k not in ours},
        "environment_set_by_memgov": {
            k: {"value": v, "why": ours[k]} for k, v in shown.items() if k in ours
        },
    }


def set_by_memgov(environ: Mapping[str, str]) -> dict[str, str]:
    """Which variables memgov set, and how it knows: its own marks, compared with the values."""
    from memgov import NO_GREEDY_PREALLOCATION
    from memgov._base import ENV_SET_MARK, settings as _settings
    from memgov._cpu import threads as _threads
    from memgov._gpu import enforce as _enforce

    why = {r.name: "memgov's note for its children" for r in _settings.TABLE if r.internal}
    why = {k: v for k, v in why.items() if k in environ}
    threads = environ.get(_threads.MARK_ENV, "").strip()
    for name in _threads.ENV_VARS:
        if threads and environ.get(name, "").strip() == threads:
            why[name] = f"a governed process's CPU thread share ({_threads.MARK_ENV}={threads})"
    holder = environ.get("MEMGOV_HOLDER", "")
    if "/" in holder and environ.get("CUDA_VISIBLE_DEVICES") == holder.split("/", 1)[0]:
        why["CUDA_VISIBLE_DEVICES"] = "the GPU of a governed process's claim (MEMGOV_HOLDER)"
    pinned = environ.get(_enforce.PIN_ENV)
    if pinned and pinned == environ.get(_enforce.MARK_ENV):
        why[_enforce.PIN_ENV] = f"a governed process's hard limit ({_enforce.MARK_ENV})"
    for name in filter(None, environ.get(ENV_SET_MARK, "").split(",")):
        if name in environ and name not in why:
            why[name] = (
                f"import memgov: no greedy preallocation ({ENV_SET_MARK})"
                if name in NO_GREEDY_PREALLOCATION
                else f"a framework adapter of a governed process ({ENV_SET_MARK})"
            )
    return why


def _ledger_problem() -> str | None:
    from memgov import _status

    try:
        return _status.ledger_problem()
    except Exception as exc:  # doctor reports, never crashes
        return f"{type(exc).__name__}: {exc}"


def _devices() -> tuple[list[dict[str, Any]], str | None]:
    from memgov._gpu.devices import devices
    from memgov._status import device_dict

    try:
        return [device_dict(d) for d in devices()], None
    except Exception as exc:
        return [], f"{type(exc).__name__}: {exc}"


def _nvml() -> dict[str, Any]:
    from memgov._gpu import devices as _devices, nvml as _nvml

    if _devices.simulated_spec() is not None:
        return {"available": None, "note": "MEMGOV_DEVICES is set: simulated devices, NVML unused"}
    reason = _nvml.unavailable_reason()
    return {"available": reason is None, "note": reason or "NVML works"}


def _frameworks() -> dict[str, Any]:
    from memgov import _adapters

    versions = {}
    for dist in [d for facts in _adapters.facts().values() for d in facts.distributions]:
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return {
        "installed": versions,
        "adapters": sorted(a.name for a in _adapters.available()),
        "adapter_problems": _adapters.load_failures(),
    }


def _threads() -> dict[str, Any]:
    from memgov._cpu import threads as _threads

    try:
        return _threads.explain()
    except Exception as exc:
        return {"decision": f"could not tell: {type(exc).__name__}: {exc}"}


def views() -> list[str]:
    """What a governed process's frameworks and tools report as its device's memory
    (docs/adapters.md, "What a governed process sees"), one line each."""
    from memgov._base import settings as _settings

    try:
        on = bool(_settings.get("MEMGOV_VIEWS"))
    except MemgovError as exc:
        return [f"views: {exc}"]
    if not on:
        return ["views: off (MEMGOV_VIEWS): a governed process sees the card's own figures"]
    return [
        "views: inside a claim, torch.cuda.mem_get_info() and pynvml's nvmlDeviceGetMemoryInfo "
        "(v1, v2; the claimed GPU) report total = the budget, free = the budget minus this "
        "process's use (MEMGOV_VIEWS=off: the card's figures)",
        "views: unchanged: torch.cuda.get_device_properties().total_memory (the card); JAX's "
        "memory_stats() bytes_limit and TensorFlow's logical device are the pool memgov caps "
        "(budget - 600 MiB); nvidia-smi and other programs reading NVML's library: the card",
    ]


def _mps() -> dict[str, Any]:
    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps"
    control = shutil.which("nvidia-cuda-mps-control")
    running = os.path.exists(os.path.join(pipe, "control"))
    from memgov._base import config as _config
    from memgov._gpu import mpsctl as _mpsctl

    limits: dict[str, Any] = {}
    try:  # a bad setting is reported, never a crash of doctor
        limits = {
            "clients_per_daemon": _mpsctl.client_limit(),
            "policy": _mpsctl.policy(),
            "contexts_per_gpu": _config.context_limit(simulated=False),
            "memgov_daemons": _mpsctl.running_daemons() if control else [],
        }
    except MemgovError as exc:
        limits = {"problem": str(exc)}
    return {
        "control_binary": control,
        "pipe_directory": pipe,
        "server_running": running,
        "pinned_limit": os.environ.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"),
        **limits,
    }


def _budget(device: dict[str, Any] | None) -> dict[str, Any]:
    """Where auto mode would take this process's budget from."""
    from memgov._base import settings as _settings
    from memgov._gpu import schedulers as _schedulers

    raw = os.environ.get("MEMGOV_CLAIM", "").strip()
    found: dict[str, Any] = {"MEMGOV_CLAIM": raw or None, "scheduler": [], "problems": []}
    if device is not None:
        reading = _schedulers.read(device["total"], device["visible_index"])
        found["scheduler"] = [
            {"source": b.source, "limit": b.limit, "budget": b.bytes, "enforced": b.enforced}
            for b in reading.budgets
        ]
        found["problems"] = reading.problems
        chosen = reading.chosen
    else:
        chosen = None
    try:
        setting = _settings.get("MEMGOV_CLAIM")
    except MemgovError as exc:
        setting = exc
    if isinstance(setting, MemgovError):
        found["decision"] = f"{setting} (auto mode warns and governs nothing; strict mode fails)"
    elif setting == "off":
        found["decision"] = "MEMGOV_CLAIM=off: auto-enable does nothing"
    elif setting is not None and setting not in ("auto", "growth"):
        found["decision"] = f"MEMGOV_CLAIM={raw}: claimed at the first GPU framework import"
    elif setting == "growth":
        found["decision"] = "MEMGOV_CLAIM=growth: no claim, frameworks only stop preallocating"
    elif chosen is not None:
        found["decision"] = f"budget {chosen.bytes} bytes from {chosen.source}" + (
            " (enforced: memgov keeps a margin below it)" if chosen.enforced else ""
        )
    elif raw:
        found["decision"] = "MEMGOV_CLAIM=auto and no scheduler budget: growth only"
    else:
        found["decision"] = (
            "no budget anywhere: `import memgov` only stops greedy preallocation; set "
            "MEMGOV_CLAIM or run `memgov run --claim SIZE -- CMD` to govern a program"
        )
    return found


def in_container() -> bool:
    if os.path.exists("/.dockerenv") or os.path.exists("/run/.containerenv"):
        return True
    try:
        cgroup = Path("/proc/1/cgroup").read_text(errors="replace")
    except OSError:
        return False
    return any(word in cgroup for word in ("docker", "kubepods", "containerd", "libpod"))


def _mount_of(path: Path) -> dict[str, str] | None:
    """The /proc/self/mountinfo entry of the mount that holds ``path``."""
    best: dict[str, str] | None = None
    try:
        lines = Path("/proc/self/mountinfo").read_text(errors="replace").splitlines()
    except OSError:
        return None
    target = str(path)
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 2:
            continue
        point = fields[4].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(best["point"])):
            best = {"point": point, "root": fields[3], "fstype": tail[0], "source": tail[1]}
    return best


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError:  # a folder above it this user may not search: ledger_problem says so
        return False


def ledger_sharing(path: Path | None = None) -> dict[str, Any]:
    """Whether the ledger folder is shared with other containers, or private to this one."""
    from memgov._base import config as _config

    try:
        folder = path or _config.ledger_dir()
    except Exception as exc:
        return {"path": None, "verdict": "error", "note": str(exc)}
    existing = folder
    while not _exists(existing) and existing != existing.parent:
        existing = existing.parent
    mount = _mount_of(existing.resolve())
    container = in_container()
    info: dict[str, Any] = {
        "path": str(folder),
        "exists": _exists(folder),
        "writable": os.access(existing, os.W_OK),
        "container": container,
        "mount": mount,
    }
    if not container:
        info["verdict"] = "host"
        info["note"] = (
            "a host folder: shared by every process on this host; containers share it only if "
            f"they bind-mount it (docker run -v {folder}:{folder})"
        )
    elif (
        mount is None
        or mount["point"] == "/"
        # A container's own scratch file system, mounted whole somewhere above the ledger. A
        # host folder bound in shows its own root; a file system mounted whole at the ledger's
        # own path was put there for it (the host's tmpfs ledger, docs/ledger.md).
        or (
            mount["fstype"] in PRIVATE_FS and mount["root"] == "/" and mount["point"] != str(folder)
        )
    ):
        where = (
            "the container's own file system"
            if mount is None or mount["point"] == "/"
            else (f"a {mount['fstype']} mount at {mount['point']}")
        )
        info["verdict"] = "private"
        info["note"] = (
            f"WARNING: the ledger is on {where}, so it looks private to this container: claims "
            "in other containers on this GPU are invisible here and the other way round. "
            f"Bind-mount one host folder into every container: docker run -v {folder}:{folder}"
        )
    else:
        info["verdict"] = "shared"
        info["note"] = (
            f"a {mount['fstype']} mount at {mount['point']} (from {mount['root']}): shared with "
            "every container that mounts the same host folder"
        )
    info["filesystem"] = mount["fstype"] if mount else None
    private = info["verdict"] == "private"
    info["flood_note"] = None if private else _flood_note(folder, info["filesystem"])
    return info


def _flood_note(folder: Path, filesystem: str | None) -> str | None:
    """Advice for a ledger every user may write (its v1/cpu/ open to all, as root makes it) on
    a disk file system: every claim writes and removes records there, which another user's
    flood of files slows (docs/ledger.md, "Floods"). None where none applies."""
    try:
        shared = bool(os.stat(folder / "v1" / "cpu").st_mode & 0o002)
    except OSError:
        return None
    if not shared or filesystem is None or filesystem in MEMORY_FS:
        return None
    return (
        f"NOTE: this ledger is open to every user but lies on {filesystem}: one who floods "
        "it with files slows every claim while it lasts (claim p99 3.0-3.2x on 16 cores, "
        "against 1.4-1.5x on a tmpfs). Make the shared ledger on a tmpfs of its own "
        '(docs/ledger.md, "Many users on a host")'
    )
