"""memgov's PyTorch adapter: cap the caching allocator so the whole process stays in its budget.

The budget counts what NVML counts for the process: CUDA context, library modules and workspaces,
and the caching allocator. Only the allocator can be capped
(``torch.cuda.set_per_process_memory_fraction``), so its cap is the budget minus the process's
measured non-allocator overhead, taken when CUDA initialises, plus a margin for libraries loaded
later (cuDNN, cuBLAS kernels). Nothing here initialises CUDA: the cap is deferred with
``torch.cuda._lazy_call`` (private API, covered by tests) until torch initialises CUDA itself.

Inside the claim ``torch.cuda.mem_get_info`` reports the budget (memgov.adapter.budget_view): a
program that sizes itself from free memory plans within its claim (docs/adapters.md, "What a
governed process sees").
"""

from __future__ import annotations

import os
import sys
from typing import Any

from memgov.adapter import (
    Budget,
    Facts,
    budget_view,
    format_size,
    imported_before_claim,
    on_threads_change,
    own_device_memory,
    setting,
    threads_now,
)

DEFAULT_OVERHEAD = 700 * 2**20
"""Used when this process's own NVML figure cannot be read (inside a PID namespace); measured
612-650 MiB on an H200 with torch 2.11 (results/HISTORY.md)."""
DEFAULT_MARGIN = 160 * 2**20
"""Device memory libraries take after CUDA initialises (cuDNN, cuBLAS and lazily loaded kernels)."""

ALLOC_CONF_VARS = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")
"""torch's allocator settings: it reads the first and, only when that is unset, the deprecated
second (c10/core/AllocatorConfig.cpp). Both name the same settings."""

_state: dict[str, Any] = {}


class TorchAdapter:
    name = "torch"
    module = "torch"
    facts = Facts(
        distributions=("torch",),
        env=ALLOC_CONF_VARS,
        # 884 MiB measured per MNIST job on an H200 (whole process, context included).
        default_claim=2**30,
        forkable=True,
        extra="torch",
    )

    def configure_env(self, budget: Budget) -> str | None:
        return None

    def cuda_initialized(self) -> bool:
        torch = sys.modules.get("torch")
        return bool(torch is not None and torch.cuda.is_initialized())

    def apply(self, budget: Budget) -> str:
        import torch

        notes = _threads(torch, budget.threads) if budget.threads else []
        if budget.bytes is None:
            return "torch: " + ", ".join([*notes, "no cap (growth only: torch never preallocates)"])
        _state["budget"] = budget
        if setting("MEMGOV_VIEWS"):
            _view_mem_get_info(torch, budget)
        if budget.simulated or budget.device_index is None:
            return "torch: " + ", ".join([*notes, "no CUDA cap on a simulated device"])
        _explain_out_of_memory(torch)
        if torch.cuda.is_initialized():
            return ", ".join([_cap(budget), *notes])
        # Reads the budget when CUDA initialises: a claim that gave memory back by then
        # (lower() below) is capped at its smaller size.
        torch.cuda._lazy_call(lambda: _cap(_state["budget"]))
        return "torch: " + ", ".join(
            [*notes, f"allocator cap from {format_size(budget.bytes)} when CUDA initialises"]
        )

    def device_use(self, budget: Budget) -> int | None:
        """What torch holds on the claimed device: the allocator's reserved memory plus the
        overhead its cap keeps for context and libraries (measured, else the default)."""
        torch = sys.modules.get("torch")
        if torch is None or not torch.cuda.is_initialized():
            return None  # no context yet: torch holds nothing on the device
        reserved: int = torch.cuda.memory_reserved(_state.get("index", budget.device_index or 0))
        return reserved + _state.get("overhead", DEFAULT_OVERHEAD + _margin())

    def release(self) -> None:
        """The claim ended: torch's mem_get_info reports the device's own figures again."""
        torch = sys.modules["torch"]  # memgov calls this only once torch is imported
        for (where, name), original in _state.pop("views", {}).items():
            module = torch.cuda if where == "cuda" else torch.cuda.memory
            setattr(module, name, original)

    def lower(self, budget: Budget) -> str | None:
        """A claim gave memory back: lower the allocator's cap to the smaller budget (torch's
        fraction can be changed at any time; memory already cached above it stays until freed)."""
        import torch

        if budget.bytes is None or budget.simulated or budget.device_index is None:
            return "torch: no CUDA cap on a simulated device"
        if not torch.cuda.is_initialized() or "overhead" not in _state:
            return None  # the cap is not applied yet: nothing measured to lower it from
        index = _torch_index(torch, budget)
        total = torch.cuda.get_device_properties(index).total_memory
        cap = budget.bytes - _state["overhead"]
        if cap < torch.cuda.memory_reserved(index):
            return None  # it holds more than that already: the claim stays as it is
        _state["budget"] = budget
        users = user_fraction()
        fraction = min(1.0, cap / total, users[0] if users else 1.0)
        torch.cuda.set_per_process_memory_fraction(fraction, index)
        _state["cap"] = int(fraction * total)
        return (
            f"torch: allocator cap lowered to {format_size(_state['cap'])} on cuda:{index} "
            f"(budget {format_size(budget.bytes)})"
        )


def _view_mem_get_info(torch: Any, budget: Budget) -> None:
    """Replace torch.cuda.mem_get_info (and torch.cuda.memory's, which accelerate and torch's own
    helpers call) with the budget's view of the claimed device; other devices are unchanged.
    get_device_properties().total_memory stays the card's: a read-only C struct of torch's."""
    if "views" in _state:
        return
    views = {("cuda", "mem_get_info"): torch.cuda.mem_get_info}
    views[("memory", "mem_get_info")] = torch.cuda.memory.mem_get_info
    _state["views"] = views

    def wrap(original: Any) -> Any:
        def mem_get_info(device: Any = None) -> tuple[int, int]:
            free, total = original(device)  # initialises CUDA, as torch's own call does
            if device is None:
                index = torch.cuda.current_device() if torch.cuda.is_initialized() else 0
            else:
                index = torch.cuda._utils._get_device_index(device, optional=True)
            budget = _state["budget"]
            if index != _state.get("index", budget.device_index or 0):
                return free, total
            return budget_view(budget.device_uuid, free) or (free, total)

        mem_get_info.__doc__ = original.__doc__
        mem_get_info.__wrapped__ = original  # type: ignore[attr-defined]
        return mem_get_info

    wrapped = {key: wrap(original) for key, original in views.items()}
    torch.cuda.mem_get_info = wrapped[("cuda", "mem_get_info")]
    torch.cuda.memory.mem_get_info = wrapped[("memory", "mem_get_info")]


def _threads(torch: Any, threads: int) -> list[str]:
    """Apply the thread budget, unless the user set torch's threads before the claim; follow
    the share as neighbours come and go, until the user sets torch's threads themselves."""
    current = torch.get_num_threads()
    if "torch" in imported_before_claim() and current < _default_threads(torch):
        return [f"torch.set_num_threads({current}) set before the claim: kept"]
    threads = threads_now(threads) or threads  # the share may have moved since the claim
    torch.set_num_threads(threads)
    _state["threads"] = threads
    notes = [f"{threads} CPU thread(s)"]
    try:
        torch.set_num_interop_threads(threads)
    except RuntimeError:  # fixed once torch has run parallel work, or set already
        notes.append("inter-op threads already fixed, left as they are")

    def follow(wanted: int) -> tuple[int, str] | None:
        # Runs on the main thread (torch's OpenMP thread count is per thread).
        mine = torch.get_num_threads()
        if mine != _state.get("threads"):  # the user called torch.set_num_threads
            return mine, f"torch.set_num_threads({mine}) by the user after the claim"
        torch.set_num_threads(wanted)
        _state["threads"] = wanted
        return None

    on_threads_change(follow)
    return notes


def _default_threads(torch: Any) -> int:
    """What torch picks with no setting: the affinity mask's size, or the physical cores (MKL
    builds). A smaller count was set by someone (OMP_NUM_THREADS is handled before this)."""
    cpus = len(os.sched_getaffinity(0))
    physical = _physical_cores() or cpus
    return min(cpus, physical)


SYSFS_CPUS = "/sys/devices/system/cpu"
SIBLING_LISTS = ("core_cpus_list", "thread_siblings_list")
"""Per CPU, the CPUs that share its core: the kernel's current name, then its deprecated one."""


def _physical_cores(root: str = SYSFS_CPUS) -> int | None:
    """The host's physical cores, the answer of ``psutil.cpu_count(logical=False)``: the number
    of distinct sibling lists in sysfs, read here the way psutil does on Linux (every
    ``cpu[0-9]*`` folder, not only the affinity mask's). Read here because importing psutil
    for it cost about 7 ms of CPU in every auto-enabled ``import torch`` (docs/threads.md); where
    sysfs has no such file (another OS, an unusual kernel), psutil itself answers."""
    try:
        # glob's cpu[0-9]*: "cpu" and an ASCII digit, whatever follows.
        names = [n for n in os.listdir(root) if n.startswith("cpu") and "0" <= n[3:4] <= "9"]
    except OSError:
        names = []
    for file in SIBLING_LISTS:  # psutil reads the second only when no CPU has the first
        lists: set[bytes] = set()
        for name in names:
            path = os.path.join(root, name, "topology", file)
            try:
                with open(path, "rb") as found:
                    lists.add(found.read().strip())
            except FileNotFoundError:
                continue
        if lists:
            return len(lists)
    import psutil  # its /proc/cpuinfo reading, or another platform's own way

    count: int | None = psutil.cpu_count(logical=False)
    return count


def _cap(budget: Budget) -> str:
    import torch

    assert budget.bytes is not None
    index = _torch_index(torch, budget)
    total = torch.cuda.get_device_properties(index).total_memory
    # torch runs this right after cuInit, before the device's context exists; NVML can only see
    # this process once it does, and the context is made now anyway, for the user's first op.
    getattr(torch.cuda.mem_get_info, "__wrapped__", torch.cuda.mem_get_info)(index)
    measured = _measured_overhead(budget.device_uuid)
    overhead = (measured or DEFAULT_OVERHEAD) + _margin()
    cap = budget.bytes - overhead
    if cap <= 0:
        cap = 1  # a budget below the context's own size: every tensor allocation fails cleanly
    fraction = min(1.0, cap / total)
    # Our call replaces the fraction torch took from its allocator settings: keep the user's if
    # it is the smaller one, under whichever of the two names it was set.
    users = user_fraction()
    kept = ""
    if users is not None and users[0] < fraction:
        fraction, cap = users[0], int(users[0] * total)
        kept = f"; the smaller per_process_memory_fraction of {users[1]} kept"
    torch.cuda.set_per_process_memory_fraction(fraction, index)
    _state.update(cap=cap, overhead=overhead, index=index)
    report = (
        f"torch: allocator capped at {format_size(cap)} on cuda:{index} "
        f"({format_size(overhead)} kept for context and libraries, "
        f"{'measured' if measured else 'default'}{kept})"
    )
    budget.report(report)  # deferred until CUDA initialised: replaces the "pending" line
    return report


def user_fraction(environ: dict[str, str] | None = None) -> tuple[float, str] | None:
    """The ``per_process_memory_fraction`` set in torch's allocator settings, and where, as torch
    reads them: PYTORCH_ALLOC_CONF, else PYTORCH_CUDA_ALLOC_CONF ("key:value,key:value")."""
    env = os.environ if environ is None else environ
    for name in ALLOC_CONF_VARS:
        raw = env.get(name)
        if raw is None:
            continue
        for item in raw.split(","):
            key, _, value = item.partition(":")
            if key.strip() != "per_process_memory_fraction":
                continue
            try:
                fraction = float(value)
            except ValueError:
                return None  # torch itself refuses it when CUDA initialises
            return (fraction, f"{name}={raw!r}") if 0 < fraction <= 1 else None
        return None  # torch reads only the first of the two that is set
    return None


def _torch_index(torch: Any, budget: Budget) -> int:
    for index in range(torch.cuda.device_count()):
        uuid = str(torch.cuda.get_device_properties(index).uuid)
        if budget.device_uuid in (uuid, f"GPU-{uuid}"):
            return index
    return budget.device_index or 0


def _measured_overhead(uuid: str) -> int | None:
    """This process's NVML footprint right after its context was made, or None if not visible.

    NVML lists host PIDs: inside a PID namespace our PID may be missing, or, rarely, belong to
    another process; a figure outside what a CUDA context can take is not believed.
    """
    used = own_device_memory(uuid)
    return used if used and _PLAUSIBLE[0] <= used <= _PLAUSIBLE[1] else None


_PLAUSIBLE = (64 * 2**20, 2 * 2**30)


def _margin() -> int:
    margin: int | None = setting("MEMGOV_TORCH_MARGIN")  # bytes, checked by memgov's table
    return DEFAULT_MARGIN if margin is None else margin


def _explain_out_of_memory(torch: Any) -> None:
    """Add memgov's budget to torch's OutOfMemoryError text, so the cause is plain."""
    cls = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
    if getattr(cls, "_memgov_explained", False):
        return
    original = cls.__str__

    def __str__(self: BaseException) -> str:
        text = original(self)
        budget: Budget | None = _state.get("budget")
        if budget is None or budget.bytes is None:
            return text
        cap = _state.get("cap")
        detail = f"; tensors capped at {format_size(cap)}" if cap else ""
        return (
            f"{text}\nmemgov: this process's budget is {format_size(budget.bytes)} on "
            f"{budget.device_uuid} (claim {budget.name!r}){detail}. Claim more, or use less."
        )

    cls.__str__ = __str__
    cls._memgov_explained = True
