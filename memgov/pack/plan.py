"""Everything a pack decides before its first job starts: the device, the claim, MPS, the runs.

:func:`prepare` checks the whole request (manifest, runner, device, MPS, claim size) and raises a
ConfigError for anything that cannot work, so a bad request never leaves half a pack behind.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memgov._base import config as _config
from memgov._base.errors import ConfigError, MemgovError
from memgov._base.sizes import Size, format_size
from memgov._gpu import devices as _devices
from memgov._gpu.devices import Device
from memgov.pack import history, hostmem, jobenv, manifest, runners
from memgov.pack.config import (
    CLAIM_ALSO,
    DEFAULT_CLAIM,
    GiB,
    PackConfig,
    check_framework,
    cores,
    report_folder,
    threads_for,
)


@dataclass
class RunPlan:
    role: str
    """"baseline" (naive greedy), "solo" (the one-job reference) or "main"."""
    label: str
    n: int
    mode: str
    mps: bool
    parallel: int
    claim_bytes: int | None
    extra_args: list[str] = field(default_factory=list)
    rogue: tuple[int, int] | None = None
    held_by: str | None = None
    """The limit that keeps ``parallel`` below ``n`` (mps_clients, contexts), or None."""
    threads: int | None = None
    """CPU threads per job when fixed by the plan (a CPU pack's solo job), else decided per run."""

    def rogue_mib(self, index: int) -> int:
        """The last K jobs of a main run are the rogue ones."""
        if self.rogue is None:
            return 0
        count, size = self.rogue
        return size if index >= self.n - count else 0


@dataclass
class Context:
    cfg: PackConfig
    manifest: manifest.Manifest
    runner: runners.Runner
    device: Device | None
    cpu: bool
    simulated: str | None
    ledger: Path
    out: Path
    epochs: int
    batch: int
    claim_bytes: int | None
    claim_source: str | None
    mps_reason: str
    mps_limit: int | None
    plans: list[RunPlan]
    host_available: int
    ledger_capacity: int | None
    ledger_free: int | None
    host_gate: hostmem.HostGate | None = None
    mps_daemons: int = 1
    """memgov MPS daemons pack runs (each admits ``mps_limit`` clients per GPU)."""
    context_limit: int | None = None
    """CUDA contexts the GPU takes without MPS (MEMGOV_CONTEXTS); None: no limit known."""
    mps_info: dict[str, Any] | None = None
    compile_cache: Path | None = None
    """The governed jobs' shared compilation cache (warmup.py); None: none."""
    compile_cache_why: str = ""
    runner_why: str = ""
    """Why this runner: the user's --runner, or what ``auto`` weighed (host memory)."""
    cache_warm: bool = False
    """A job of this pack has reported start with the cache: no warm-up needed any more."""

    @property
    def folder(self) -> Path:
        return self.manifest.folder

    @property
    def device_uuid(self) -> str | None:
        return None if self.cpu or self.device is None else self.device.uuid

    @property
    def history_key(self) -> str:
        return history.key(self.manifest.name, self.cfg.framework, self.batch)

    @property
    def host_history_key(self) -> str:
        """Host USS differs with the device (CUDA libraries), the mode (a greedy JAX job holds
        several GiB more than a governed one) and the runner (a job forked by ``preload`` shares
        its framework's pages with the zygote), so each keeps its own peaks."""
        return host_key(self.history_key, self.cpu, self.cfg.mode, self.runner.name)

    def base_env(self, mode: str) -> dict[str, str]:
        return jobenv.inherited(mode)

    def job_env(
        self, plan: RunPlan, threads: int | None, mps: tuple[Path, Path] | None
    ) -> dict[str, str]:
        """What pack decides for each job of ``plan`` (jobenv.py), its compilation cache too."""
        governed = plan.mode != "greedy"
        env = jobenv.decided(
            jobenv.JobEnv(
                mode=plan.mode,
                claim=str(plan.claim_bytes),
                threads=threads,
                wait=self.cfg.wait,
                ledger=self.ledger,
                visible=self.device_uuid,
                simulated=self.simulated,
                # the simulated GPU pack watches (--gpu)
                device=self.device.uuid if self.simulated and self.device else None,
                mps_pipe=mps[0] if mps else None,
                mps_log=mps[1] if mps else None,
            )
        )
        if self.compile_cache is not None and governed:
            from memgov.pack import warmup

            env.update(warmup.cache_env(self.compile_cache, self.cfg.framework))
        return env

    @property
    def cpu_defaults(self) -> dict[str, Any] | None:
        """The manifest's small CPU run, where it applied (--device cpu, not overridden)."""
        man = self.manifest
        used_epochs = self.cpu and self.cfg.epochs is None and man.cpu_epochs is not None
        used_args = self.cpu and not self.cfg.trainer_args and bool(man.cpu_args)
        if not (used_epochs or used_args):
            return None
        return {
            "epochs": man.cpu_epochs if used_epochs else None,
            "args": list(man.cpu_args) if used_args else None,
        }

    def notes(self) -> list[str]:
        """Caveats a reader of the figures needs, printed under the table and kept in the report."""
        notes = []
        defaults = self.cpu_defaults
        if defaults is not None:
            used = []
            if defaults["epochs"] is not None:
                used.append(f"--epochs {defaults['epochs']}")
            if defaults["args"]:
                used.append("-- " + " ".join(defaults["args"]))
            notes.append(
                f"a small CPU run by default ({' '.join(used)}, from {self.manifest.path}"
                " [cpu]); scale it with --epochs N and trainer arguments after --"
            )
        if self.cpu and any(p.role == "solo" for p in self.plans):
            busiest = max((p.parallel for p in self.plans if p.role == "main"), default=1)
            threads = threads_for(self.cfg, busiest)
            notes.append(
                f"CPU: every job shares this machine's {cores()} core(s) and the solo job ran with"
                f" the {threads} thread(s) of one packed job, so 'x one job' says how the jobs "
                f"share the cores (at most about {max(1, cores() // threads)}x here), not how "
                "they would pack on a GPU"
            )
        if self.runner_why.startswith("auto") and "preload" in self.runner_why:
            notes.append(f"runner {self.runner_why}")
        return notes

    @property
    def trainer_args(self) -> list[str]:
        if self.cpu and not self.cfg.trainer_args:
            return list(self.manifest.cpu_args)
        return list(self.cfg.trainer_args)

    def argv(self, plan: RunPlan, index: int) -> list[str]:
        python = self.runner.python_in_job or self.cfg.python
        argv = self.manifest.command(
            self.cfg.framework,
            python=python,
            epochs=self.epochs,
            batch=self.batch,
            device="cpu" if self.cpu else "gpu",
        )
        argv += [*self.trainer_args, *plan.extra_args]
        size = plan.rogue_mib(index)
        return argv + (self.manifest.rogue(size) if size else [])

    @contextlib.contextmanager
    def mps_daemon(self) -> Iterator[dict[str, Any]]:
        from memgov._gpu import mps as _mps

        with _mps.daemon(daemons=self.mps_daemons) as info:
            yield {
                "used": True,
                "reason": self.mps_reason,
                "started_here": bool(info.get("started_here")),
                "pipe": info.get("pipe"),
                "daemon_pid": info.get("daemon_pid"),
                "client_limit": self.mps_limit,
                "daemons": self.mps_daemons,
                "policy": info.get("policy"),
                "start_s": info.get("start_s"),
                "daemon_pids": [d.get("daemon_pid") for d in info.get("daemons", [])],
            }

    def mps_paths(self) -> tuple[Path, Path]:
        from memgov._gpu import mpsctl as _mpsctl

        p = _mpsctl.paths()
        return p.pipe, p.log


def prepare(cfg: PackConfig) -> Context:
    """Check the whole request and decide everything before the first job starts, in steps:
    the workload (manifest, epochs, batch), the device (GPU, claim, MPS), the runs, the runner,
    then the caches and the host-memory gate the jobs share."""
    cfg.check()
    cpu = cfg.device == "cpu"
    man, epochs, batch = _workload(cfg, cpu)
    sizes = cfg.sweep or [cfg.n]
    dev = _on_device(cfg, man.name, batch, cpu, max(sizes))
    plans = _plans(cfg, sizes, dev.mps, dev.mps_limit, dev.claim_bytes, dev.contexts)
    argv = man.command(
        cfg.framework, python=cfg.python, epochs=epochs, batch=batch, device="cpu" if cpu else "gpu"
    )
    runner_name, runner_why = _runner_choice(
        cfg, history.key(man.name, cfg.framework, batch), cpu, plans, argv, man.folder
    )
    ledger = _config.ledger_dir()
    runner = runners.make(
        runner_name,
        runners.RunnerRequest(
            framework=cfg.framework,
            image=cfg.image,
            ledger=ledger,
            gpu=None if dev.device is None or cpu else dev.device.uuid,
            mps_pipe=_mps_pipe() if dev.mps else None,
        ),
    )
    runner.check()
    if cpu:
        _fair_solo(cfg, plans)
    import psutil

    from memgov._gpu import mpsctl as _mpsctl

    ctx = Context(
        cfg=cfg,
        manifest=man,
        runner=runner,
        device=dev.device,
        cpu=cpu,
        simulated=dev.simulated if cpu else None,
        ledger=ledger,
        out=report_folder(cfg.out or _default_out(man.name, cfg)).resolve(),
        epochs=epochs,
        batch=batch,
        claim_bytes=dev.claim_bytes,
        claim_source=dev.claim_source,
        mps_reason=dev.mps_reason,
        mps_limit=dev.mps_limit if dev.mps else None,
        plans=plans,
        mps_daemons=cfg.mps_daemons
        or _mpsctl.daemons_for(max([min(p.n, p.parallel) for p in plans if p.mps], default=1)),
        context_limit=dev.contexts,
        runner_why=runner_why,
        host_available=psutil.virtual_memory().available,
        ledger_capacity=dev.snap.capacity if dev.snap else None,
        ledger_free=dev.snap.free if dev.snap else None,
    )
    _shared(ctx)
    return ctx


def _workload(cfg: PackConfig, cpu: bool) -> tuple[manifest.Manifest, int, int]:
    """The experiment's manifest, and the epochs and batch its jobs run (0: the trainer's)."""
    man = manifest.load(cfg.experiment)
    man.framework(cfg.framework)
    if cfg.runner != "docker":  # docker jobs run the image's python
        check_framework(cfg.python, cfg.framework)
    epochs = cfg.epochs or (man.cpu_epochs if cpu else None) or man.epochs
    batch = cfg.batch or man.batch
    for name, value in (("epochs", epochs), ("batch", batch)):
        if value is None and man.uses(cfg.framework, name):
            raise ConfigError(f"--{name}: {man.path} has no [defaults] {name}; pass --{name} N")
    return man, epochs or 0, batch or 0


@dataclass
class OnDevice:
    """What a pack decided about its GPU: which, the claim per job, MPS, the context limit."""

    device: Device | None
    simulated: str | None
    claim_bytes: int | None
    claim_source: str | None
    mps: bool
    mps_reason: str
    mps_limit: int
    contexts: int | None
    snap: Any
    """The device's ledger as pack found it (claim mode), or None."""


def _on_device(cfg: PackConfig, name: str, batch: int, cpu: bool, most: int) -> OnDevice:
    device, simulated = _device(cfg, cpu)
    claim_bytes, claim_source = _claim(cfg, name, batch, device)
    if cpu and device is None:
        # pack's own simulated GPU holds every job; set MEMGOV_DEVICES to see refusals.
        total = max(16 * GiB, most * (claim_bytes or 0) + GiB)
        simulated = f"sim0:{total // 2**20}MiB"
        device = _devices.simulated_devices(simulated)[0]
    mps, reason, limit = _mps_choice(cfg, cpu)
    snap = None
    if device is not None and cfg.mode == "claim":
        from memgov._ledger.ledger import DeviceLedger

        snap = DeviceLedger(device).snapshot()
        largest = history.largest(history.key(name, cfg.framework, batch))
        claim_bytes, claim_source = _fit_to_device(
            cfg, largest, snap.free, claim_bytes, claim_source, most, mps
        )
    contexts = None
    if device is not None and not device.simulated and not cpu:
        contexts = _config.context_limit(simulated=False)
    return OnDevice(
        device, simulated, claim_bytes, claim_source, mps, reason, limit, contexts, snap
    )


def _fair_solo(cfg: PackConfig, plans: list[RunPlan]) -> None:
    """A fair reference on CPU: the solo job gets the threads each packed job gets (those of the
    run with the most jobs at once), not every core; with all cores it ran slower than one of
    two packed jobs on 2 cores, and "x one job" came out at 6.6-15.7."""
    busiest = max((p.parallel for p in plans if p.role == "main"), default=1)
    for p in plans:
        if p.role == "solo":
            p.threads = threads_for(cfg, busiest)


def _shared(ctx: Context) -> None:
    """What the jobs share on the host: JAX's compilation cache and the host-memory gate."""
    import psutil

    from memgov.pack import warmup

    cfg = ctx.cfg
    ctx.compile_cache, ctx.compile_cache_why = warmup.cache_folder(
        cfg.compile_cache, cfg.framework, ctx.out
    )
    if ctx.compile_cache is not None and isinstance(ctx.runner, runners.DockerRunner):
        ctx.runner.mounts.append(ctx.compile_cache)
    recorded = [p["bytes"] for p in history.read(ctx.host_history_key)] if cfg.history else []
    ctx.host_gate = hostmem.gate(cfg.host_per_job, recorded, psutil.virtual_memory().total)


def host_key(history_key: str, cpu: bool, mode: str, runner: str) -> str:
    """Host USS differs with the device (CUDA libraries), the mode (a greedy JAX job holds
    several GiB more than a governed one) and the runner (a job forked by ``preload`` shares
    its framework's pages with the zygote), so each keeps its own peaks."""
    suffix = "" if runner == "process" else f"-{runner}"
    return f"{history_key}-host-{'cpu' if cpu else 'gpu'}-{mode}{suffix}"


def _runner_choice(
    cfg: PackConfig, key: str, cpu: bool, plans: list[RunPlan], argv: list[str], folder: Path
) -> tuple[str, str]:
    """(runner name, why) for ``--runner`` (``auto``: process while the busiest run's jobs fit
    the host's memory as processes, else preload, whose forked jobs share the framework's pages:
    ~1.28 vs ~0.8 GiB of host USS per torch job on the H200, docs/pack.md)."""
    if cfg.runner != "auto":
        return cfg.runner, f"--runner {cfg.runner}"
    import psutil

    at_once = max((min(p.n, p.parallel) for p in plans), default=1)
    recorded = (
        [p["bytes"] for p in history.read(host_key(key, cpu, cfg.mode, "process"))]
        if cfg.history
        else []
    )
    per_job = max(recorded) if recorded else hostmem.DEFAULT_PER_JOB
    source = (
        f"the largest of {len(recorded)} recorded"
        if recorded
        else "memgov's default, nothing recorded"
    )
    total = psutil.virtual_memory()
    room = total.available - hostmem.reserve_for(total.total)
    need = at_once * per_job
    weighed = (
        f"{at_once} jobs at once as processes need ~{format_size(need)} of host memory "
        f"({format_size(per_job)} each: {source}), {format_size(max(room, 0))} is "
        "available beyond the reserve"
    )
    if need <= room:
        return "process", f"auto: process: {weighed}"
    why_not = _why_not_forked(cfg, argv, folder)
    if why_not is not None:
        return "process", f"auto: process, though {weighed}: preload {why_not}"
    return "preload", (
        f"auto: preload: {weighed}; forked from one process that imported "
        f"{cfg.framework} once, the jobs share its pages"
    )


def _why_not_forked(cfg: PackConfig, argv: list[str], folder: Path) -> str | None:
    from memgov import _adapters

    # Its import leaves no thread running through fork (TensorFlow's jemalloc thread does).
    forkable = [name for name, facts in _adapters.facts().items() if facts.forkable]
    if cfg.framework not in forkable:
        return f"forks only {', '.join(sorted(forkable))} jobs (--framework {cfg.framework})"
    if len(argv) < 2 or argv[1].startswith("-") or not (folder / argv[1]).is_file():
        return f"forks only `python SCRIPT` commands, not {' '.join(argv[:2])}"
    return None


def _device(cfg: PackConfig, cpu: bool) -> tuple[Device | None, str | None]:
    if cpu:
        spec = _devices.simulated_spec()
        if spec is not None:  # the user's own simulated GPUs (e.g. a small one, to see refusals)
            return _devices.candidates(cfg.gpu)[0], spec
        return None, None
    try:
        return _devices.candidates(cfg.gpu)[0], None
    except MemgovError as exc:
        # Not the library's hint of simulated GPUs (MEMGOV_DEVICES): a GPU pack refuses them
        # (they hold no real job); pack on CPU uses them.
        said = str(exc).partition("; on a machine without a GPU")[0]
        raise ConfigError(
            f"{said}; on a machine without a GPU pack on CPU with --device cpu (CI, laptops; "
            'with MEMGOV_DEVICES="sim0:16GiB" its jobs claim on a simulated GPU)'
        ) from None


def _claim(
    cfg: PackConfig, name: str, batch: int, device: Device | None
) -> tuple[int | None, str | None]:
    if cfg.mode != "claim":
        return None, None
    if cfg.claim.strip().lower() != "auto":
        asked = Size(cfg.claim, "--claim", also=CLAIM_ALSO)
        return _explicit_claim(asked, device), f"--claim {cfg.claim}"
    key = history.key(name, cfg.framework, batch)
    found = history.auto_size(key)
    if found is not None:
        return found
    from memgov import _adapters

    facts = _adapters.facts().get(cfg.framework)
    size = (facts and facts.default_claim) or DEFAULT_CLAIM
    return size, (
        f"default for {cfg.framework} ({format_size(size)}): no measured peaks for "
        f"{key} yet (a pack on a GPU records them)"
    )


def _explicit_claim(size: Size, device: Device | None) -> int:
    """``--claim SIZE`` in bytes, checked where every size meets a device (_devices.sizes_on):
    the GPU, or the user's simulated one (MEMGOV_DEVICES). pack's own simulated GPU of a CPU
    pack is sized to hold every job, so there the claim is a size or percentage of this host's
    memory, which that GPU stands for: a CPU job cannot use more."""
    if device is not None:
        return _devices.sizes_on(size, [device])[device.uuid]
    import psutil

    return size.on(psutil.virtual_memory().total, "this host's memory")


MPS_SERVER_ALLOWANCE = 128 * 2**20
"""GPU memory kept aside per MPS server pack will start (each held 66 MiB on the H200)."""


def learn_claim(ctx: Context, footprint: int | None) -> None:
    """The solo job's footprint (bytes) sizes the packed runs' automatic claims where nothing
    was recorded (the default claim), as a recorded footprint would: x 1.10 + 64 MiB, made
    smaller so each run's jobs fit the GPU at once. From a fresh ledger on the H200, 140 default
    1 GiB claims did not fit (the 140th was refused); 140 of 1,017 MiB did."""
    cfg = ctx.cfg
    automatic = cfg.mode == "claim" and cfg.claim.strip().lower() == "auto"
    if not automatic or not footprint or ctx.device is None:  # a CPU job has no footprint
        return
    if not (ctx.claim_source or "").startswith("default"):
        return
    from memgov._ledger.ledger import DeviceLedger

    free = DeviceLedger(ctx.device).snapshot().free
    size, source = (
        history.margin(footprint),
        (
            f"this pack's solo job: footprint {format_size(footprint)} x "
            f"{1 + history.MARGIN_FRACTION:.2f} + {format_size(history.MARGIN_BYTES)}"
        ),
    )
    for plan in ctx.plans:
        if plan.role == "main" and plan.mode == "claim":
            plan.claim_bytes, ctx.claim_source = _fit_to_device(
                cfg, footprint, free, size, source, min(plan.n, plan.parallel), plan.mps
            )
            ctx.claim_bytes = plan.claim_bytes


def _fit_to_device(
    cfg: PackConfig,
    top: int | None,
    free: int,
    claim: int | None,
    source: str | None,
    n: int,
    mps: bool,
) -> tuple[int | None, str | None]:
    """An automatic claim made smaller so ``n`` jobs fit the device's free budget at once, when
    the measured footprints allow it (at least the largest, ``top``, + 64 MiB); otherwise as is.

    The automatic size is the largest footprint x 1.10 + 64 MiB; 140 such claims of an MNIST
    job (886 MiB) did not fit an H200, while 140 of its footprints did.
    """
    if claim is None or cfg.claim.strip().lower() != "auto":
        return claim, source  # an explicit --claim is never changed
    if top is None:
        return claim, source
    from memgov._gpu import mpsctl as _mpsctl

    if mps:
        free -= _mpsctl.daemons_for(n) * MPS_SERVER_ALLOWANCE
    share = max(0, free // max(n, 1)) // 2**20 * 2**20
    floor = top + history.MARGIN_BYTES
    if claim * n <= free or share < floor:
        return claim, source
    return share, (
        f"{source}, made {format_size(share)} so that {n} jobs fit the "
        f"{format_size(free)} free on the GPU at once (the largest measured footprint "
        f"+ {format_size(history.MARGIN_BYTES)} is {format_size(floor)})"
    )


def _mps_choice(cfg: PackConfig, cpu: bool) -> tuple[bool, str, int]:
    from memgov._gpu import mpsctl as _mpsctl

    limit = _mpsctl.client_limit()
    if cfg.mode == "greedy":
        return False, "--mode greedy: frameworks at their defaults, no MPS", limit
    if cpu:
        return False, "--device cpu: no GPU", limit
    if cfg.mps == "off":
        return False, "--mps off", limit
    if _mpsctl.binary() is None:
        if cfg.mps == "on":
            _mpsctl.require_binary()  # raises, saying where the program comes from
        return False, f"{_mpsctl.CONTROL} not on PATH (--mps auto)", limit
    most = limit * _mpsctl.MAX_DAEMONS
    if cfg.parallel is not None and cfg.parallel > most:
        raise ConfigError(
            f"--parallel {cfg.parallel}: an MPS daemon admits {limit} clients per GPU "
            f"(MEMGOV_MPS_CLIENTS sets it) and pack runs at most {_mpsctl.MAX_DAEMONS} daemons; "
            f"accepted --parallel up to {most}, or --mps off"
        )
    return True, f"--mps {cfg.mps}: {_mpsctl.CONTROL} found", limit


def _mps_pipe() -> Path:
    from memgov._gpu import mpsctl as _mpsctl

    return _mpsctl.paths().pipe


def _plans(
    cfg: PackConfig,
    sizes: list[int],
    mps: bool,
    limit: int,
    claim: int | None,
    contexts: int | None = None,
) -> list[RunPlan]:
    """The runs of the pack. Jobs at once are capped by what the GPU takes: under MPS, clients
    (``limit`` per daemon, at most MAX_DAEMONS daemons or ``--mps-daemons``); without it, CUDA
    contexts (``contexts``, MEMGOV_CONTEXTS). The rest queue and start as others end."""
    from memgov._gpu.mpsctl import MAX_DAEMONS

    def parallel(n: int, under_mps: bool) -> tuple[int, str | None]:
        wanted = min(cfg.parallel or n, n)
        cap: int | None = contexts
        why = "contexts"
        if under_mps:
            cap, why = limit * (cfg.mps_daemons or MAX_DAEMONS), "mps_clients"
        if cap is not None and wanted > cap:
            return cap, why
        return wanted, None

    plans = []
    if cfg.baseline == "naive":
        at_once, why = parallel(cfg.n, False)
        plans.append(
            RunPlan(
                "baseline",
                "baseline",
                cfg.n,
                "greedy",
                False,
                at_once,
                None,
                list(cfg.baseline_args),
                held_by=why,
            )
        )
    if cfg.solo and 1 not in sizes:
        plans.append(RunPlan("solo", "solo", 1, cfg.mode, mps, 1, claim))
    for n in sizes:
        at_once, why = parallel(n, mps)
        plans.append(
            RunPlan("main", f"n{n}", n, cfg.mode, mps, at_once, claim, rogue=cfg.rogue, held_by=why)
        )
    return plans


def _default_out(name: str, cfg: PackConfig) -> Path:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    n = "sweep" if cfg.sweep else f"n{cfg.n}"
    return Path("pack-results") / f"{name}-{cfg.framework}-{cfg.mode}-{n}-{stamp}-{os.getpid()}"
