"""Everything a pack decides before its first job starts: the device, the claim, MPS, the runs.

:func:`prepare` checks the whole request (manifest, runner, device, MPS, claim size) and raises a
ConfigError for anything that cannot work, so a bad request never leaves half a pack behind.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memgov import _config, _devices
from memgov._devices import Device
from memgov._errors import ConfigError, MemgovError
from memgov._sizes import format_size, mib, parse_size
from memgov.pack import history, hostmem, manifest, runners, stats
from memgov.pack.config import (
    DEFAULT_CLAIM,
    DEFAULT_CLAIM_OTHER,
    GiB,
    PackConfig,
    base_env,
    cores,
    report_folder,
    threads_for,
)
from memgov.pack.monitor import Sampler


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
    mps_info: dict[str, Any] | None = None
    solo_record: dict[str, Any] | None = None

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
        """Host USS differs with the device (CUDA libraries) and the mode (a greedy JAX job holds
        several GiB more than a governed one), so each pair keeps its own peaks."""
        return f"{self.history_key}-host-{'cpu' if self.cpu else 'gpu'}-{self.cfg.mode}"

    def base_env(self, mode: str) -> dict[str, str]:
        return base_env(mode)

    @property
    def cpu_defaults(self) -> dict[str, Any] | None:
        """The manifest's small CPU run, where it applied (--device cpu, not overridden)."""
        man = self.manifest
        used_epochs = self.cpu and self.cfg.epochs is None and man.cpu_epochs is not None
        used_args = self.cpu and not self.cfg.trainer_args and bool(man.cpu_args)
        if not (used_epochs or used_args):
            return None
        return {"epochs": man.cpu_epochs if used_epochs else None,
                "args": list(man.cpu_args) if used_args else None}

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
            notes.append(f"a small CPU run by default ({' '.join(used)}, from {self.manifest.path}"
                         " [cpu]); scale it with --epochs N and trainer arguments after --")
        if self.cpu and any(p.role == "solo" for p in self.plans):
            busiest = max((p.parallel for p in self.plans if p.role == "main"), default=1)
            threads = threads_for(self.cfg, busiest)
            notes.append(
                f"CPU: every job shares this machine's {cores()} core(s) and the solo job ran with"
                f" the {threads} thread(s) of one packed job, so 'x one job' says how the jobs "
                f"share the cores (at most about {max(1, cores() // threads)}x here), not how "
                "they would pack on a GPU")
        return notes

    @property
    def trainer_args(self) -> list[str]:
        if self.cpu and not self.cfg.trainer_args:
            return list(self.manifest.cpu_args)
        return list(self.cfg.trainer_args)

    def argv(self, plan: RunPlan, index: int) -> list[str]:
        python = self.runner.python_in_job or self.cfg.python
        argv = self.manifest.command(self.cfg.framework, python=python, epochs=self.epochs,
                                     batch=self.batch, device="cpu" if self.cpu else "gpu")
        argv += [*self.trainer_args, *plan.extra_args]
        size = plan.rogue_mib(index)
        return argv + (self.manifest.rogue(size) if size else [])

    @contextlib.contextmanager
    def mps_daemon(self) -> Iterator[dict[str, Any]]:
        from memgov import _mps

        with _mps.daemon() as info:
            yield {"used": True, "reason": self.mps_reason,
                   "started_here": bool(info.get("started_here")), "pipe": info.get("pipe"),
                   "daemon_pid": info.get("daemon_pid"), "client_limit": self.mps_limit}

    def mps_paths(self) -> tuple[Path, Path]:
        from memgov import _mps

        p = _mps.paths()
        return p.pipe, p.log

    def run_fields(self, plan: RunPlan, sampler: Sampler, threads: int | None, concurrent: int,
                   wall: float) -> dict[str, Any]:
        return {
            "role": plan.role,
            "label": plan.label,
            "mode": plan.mode,
            "mps": plan.mps,
            "threads_per_job": threads,
            "parallel": concurrent,
            "claim_mib": mib(plan.claim_bytes),
            "claim_source": self.claim_source if plan.claim_bytes else None,
            "trainer_args": [*self.trainer_args, *plan.extra_args],
            "rogue": {"jobs": plan.rogue[0], "mib": plan.rogue[1]} if plan.rogue else None,
            "wall_s": round(wall, 3),
            "timeout_s": self.cfg.timeout,
            "device_total_mib": mib(sampler.device_total),
            "device_used_before_mib": mib(sampler.device_used_before),
            "device_peak_used_mib": mib(sampler.device_peak),
            "host_rss_peak_mib": mib(sampler.host_rss_peak),
            "host_uss_peak_mib": mib(sampler.host_uss_peak),
            "host_used_peak_mib": mib(sampler.host_used_peak),
            "monitor": sampler.summary(),
            "_free_before": (None if sampler.device_total is None or sampler.device_used_before
                             is None else sampler.device_total - sampler.device_used_before),
        }

    def report_head(self) -> dict[str, Any]:
        import memgov

        device = None
        if self.device is not None:
            device = {"uuid": self.device.uuid, "name": self.device.name,
                      "total_mib": mib(self.device.total), "simulated": self.device.simulated}
        return {
            "version": 1,
            "memgov": memgov.__version__,
            "command": list(sys.argv),
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "experiment": self.manifest.name,
            "manifest": str(self.manifest.path),
            "framework": self.cfg.framework,
            "mode": self.cfg.mode,
            "runner": self.cfg.runner,
            "device_kind": "cpu" if self.cpu else "gpu",
            "device": device,
            "host": {"cores": cores(), "available_before_mib": mib(self.host_available)},
            "epochs": self.epochs,
            "batch": self.batch,
            "cpu_defaults": self.cpu_defaults,
            "notes": self.notes(),
            "claim": None if self.claim_bytes is None else {
                "mib": mib(self.claim_bytes), "bytes": self.claim_bytes,
                "source": self.claim_source},
            "mps": {"used": False, "reason": self.mps_reason},
            "sweep": self.cfg.sweep,
            "runs": [],
            "solo": None,
            "baseline": None,
            "history": None,
            "interrupted": False,
            "out": str(self.out),
        }

    def add_run(self, report: dict[str, Any], plan: RunPlan, record: dict[str, Any]) -> None:
        free_before = record.pop("_free_before")
        real = self.device is not None and not self.device.simulated
        record["capacity"] = stats.capacity(
            record, device_total=self.device.total if real and self.device else None,
            device_free_before=free_before,
            claim_bytes=plan.claim_bytes, ledger_capacity=self.ledger_capacity,
            host_available=self.host_available, mps_limit=self.mps_limit if plan.mps else None)
        if plan.role == "solo" or (plan.role == "main" and plan.n == 1
                                   and self.solo_record is None):
            self.solo_record = record
        report["runs"].append(record)
        if plan.role in ("solo", "baseline"):
            report[plan.role] = record
        if self.mps_info is not None:
            report["mps"] = dict(self.mps_info)
        if plan.role == "main" and self.cfg.history:  # solo/baseline jobs run with more threads
            self._record_host(record)
        if plan.role == "main" and plan.mode != "greedy" and not self.cpu and self.cfg.history:
            peaks = [int(j["footprint_mib"] * 2**20) for j in record["jobs"]
                     if j["status"] == "ok" and not j["rogue_mib"] and j["footprint_mib"]]
            try:
                kept = history.record(self.history_key, peaks, mode=plan.mode, n=plan.n,
                                      device=self.device.name if self.device else None)
                report["history"] = {"key": self.history_key, "recorded": len(peaks),
                                     "kept": len(kept), "next_auto": history.auto_size(
                                         self.history_key)}
            except MemgovError as exc:
                report["history"] = {"key": self.history_key, "error": str(exc)}

    def _record_host(self, record: dict[str, Any]) -> None:
        peaks = [int(j["uss_mib"] * 2**20) for j in record["jobs"]
                 if j["status"] == "ok" and not j["rogue_mib"] and j["uss_mib"]]
        with contextlib.suppress(MemgovError):  # a sizing aid: never fail a finished pack
            history.record(self.host_history_key, peaks, n=len(record["jobs"]))

    def finish(self, report: dict[str, Any], interrupted: bool) -> None:
        report["interrupted"] = interrupted
        if self.mps_info is not None and self.mps_info.get("started_here"):
            from memgov import _mps

            report["mps"]["stopped"] = not _mps.reachable(self.mps_paths()[0])
        for run in report["runs"]:  # at the end: the baseline runs before the solo job
            solo = None if run is self.solo_record else self.solo_record
            run.update(stats.compare(run, solo))
        mains = [r for r in report["runs"] if r["role"] == "main"]
        top = mains[-1] if mains else (report["runs"][-1] if report["runs"] else None)
        if top is None:
            report.update(n=0, ok=0, failed=0, jobs=[], footprint_mib=None, epoch_s=None,
                          aggregate_samples_per_s=None, device_peak_used_mib=None)
            return
        # The main run's figures at the top level; "mps" there stays the pack's MPS details.
        report.update({k: v for k, v in top.items() if k not in ("role", "label", "mps")})


def prepare(cfg: PackConfig) -> Context:
    cfg.check()
    man = manifest.load(cfg.experiment)
    man.framework(cfg.framework)
    cpu = cfg.device == "cpu"
    epochs = cfg.epochs or (man.cpu_epochs if cpu else None) or man.epochs
    batch = cfg.batch or man.batch
    for name, value in (("epochs", epochs), ("batch", batch)):
        if value is None and man.uses(cfg.framework, name):
            raise ConfigError(f"--{name}: {man.path} has no [defaults] {name}; pass --{name} N")
    ledger = _config.ledger_dir()
    sizes = cfg.sweep or [cfg.n]
    device, simulated = _device(cfg, cpu)
    claim_bytes, claim_source = _claim(cfg, man.name, batch or 0, device)
    if cpu and device is None:
        # pack's own simulated GPU holds every job; set MEMGOV_DEVICES to see refusals.
        total = max(16 * GiB, max(sizes) * (claim_bytes or 0) + GiB)
        simulated = f"sim0:{total // 2**20}MiB"
        device = _devices._simulated(simulated)[0]
    mps, reason, limit = _mps_choice(cfg, cpu)
    runner = runners.make(cfg.runner, image=cfg.image, ledger=ledger,
                          gpu=None if device is None or cpu else device.uuid,
                          mps_pipe=_mps_pipe() if mps else None)
    runner.check()
    plans = _plans(cfg, sizes, mps, limit, claim_bytes)
    if cpu:
        # A fair reference on CPU: the solo job gets the threads each packed job gets (those of
        # the run with the most jobs at once), not every core; with all cores it ran slower than
        # one of two packed jobs on 2 cores, and "x one job" came out at 6.6-15.7.
        busiest = max((p.parallel for p in plans if p.role == "main"), default=1)
        for p in plans:
            if p.role == "solo":
                p.threads = threads_for(cfg, busiest)
    import psutil

    snap = None
    if device is not None and cfg.mode == "claim":
        from memgov._ledger import DeviceLedger

        snap = DeviceLedger(device).snapshot()
    out = report_folder(cfg.out or _default_out(man.name, cfg))
    ctx = Context(
        cfg=cfg, manifest=man, runner=runner, device=device, cpu=cpu,
        simulated=simulated if cpu else None, ledger=ledger, out=out.resolve(),
        epochs=epochs or 0, batch=batch or 0, claim_bytes=claim_bytes,
        claim_source=claim_source, mps_reason=reason, mps_limit=limit if mps else None,
        plans=plans, host_available=psutil.virtual_memory().available,
        ledger_capacity=snap.capacity if snap else None, ledger_free=snap.free if snap else None,
    )
    recorded = [p["bytes"] for p in history.read(ctx.host_history_key)] if cfg.history else []
    ctx.host_gate = hostmem.gate(cfg.host_per_job, recorded, psutil.virtual_memory().total)
    return ctx


def _device(cfg: PackConfig, cpu: bool) -> tuple[Device | None, str | None]:
    if cpu:
        spec = _devices.simulated_spec()
        if spec is not None:  # the user's own simulated GPUs (e.g. a small one, to see refusals)
            return _devices.candidates(cfg.gpu)[0], spec
        return None, None
    try:
        return _devices.candidates(cfg.gpu)[0], None
    except MemgovError as exc:
        raise ConfigError(f"{exc}; for a CPU pack (CI, laptops) pass --device cpu") from None


def _claim(cfg: PackConfig, name: str, batch: int, device: Device | None
           ) -> tuple[int | None, str | None]:
    if cfg.mode != "claim":
        return None, None
    total = device.total if device is not None and not device.simulated else None
    if cfg.claim.strip().lower() != "auto":
        try:
            return parse_size(cfg.claim, total=total, what="--claim"), f"--claim {cfg.claim}"
        except ValueError as exc:
            raise ConfigError(f"{exc}; or auto (measured peaks, see docs/pack.md)") from None
    key = history.key(name, cfg.framework, batch)
    found = history.auto_size(key)
    if found is not None:
        return found
    size = DEFAULT_CLAIM.get(cfg.framework, DEFAULT_CLAIM_OTHER)
    return size, (f"default for {cfg.framework} ({format_size(size)}): no measured peaks for "
                  f"{key} yet (a pack on a GPU records them)")


def _mps_choice(cfg: PackConfig, cpu: bool) -> tuple[bool, str, int]:
    from memgov import _mps

    limit = _mps.client_limit()
    if cfg.mode == "greedy":
        return False, "--mode greedy: frameworks at their defaults, no MPS", limit
    if cpu:
        return False, "--device cpu: no GPU", limit
    if cfg.mps == "off":
        return False, "--mps off", limit
    if _mps.binary() is None:
        if cfg.mps == "on":
            _mps.require_binary()  # raises, saying where the program comes from
        return False, f"{_mps.CONTROL} not on PATH (--mps auto)", limit
    if cfg.parallel is not None and cfg.parallel > limit:
        raise ConfigError(
            f"--parallel {cfg.parallel}: an MPS server admits {limit} clients per GPU "
            "(MEMGOV_MPS_CLIENTS sets it); accepted --parallel up to that, or --mps off")
    return True, f"--mps {cfg.mps}: {_mps.CONTROL} found", limit


def _mps_pipe() -> Path:
    from memgov import _mps

    return _mps.paths().pipe


def _plans(cfg: PackConfig, sizes: list[int], mps: bool, limit: int,
           claim: int | None) -> list[RunPlan]:
    def parallel(n: int, under_mps: bool) -> int:
        wanted = cfg.parallel or n
        return min(wanted, limit) if under_mps else wanted

    plans = []
    if cfg.baseline == "naive":
        plans.append(RunPlan("baseline", "baseline", cfg.n, "greedy", False, parallel(cfg.n, False),
                             None, list(cfg.baseline_args)))
    if cfg.solo and 1 not in sizes:
        plans.append(RunPlan("solo", "solo", 1, cfg.mode, mps, 1, claim))
    for n in sizes:
        plans.append(RunPlan("main", f"n{n}", n, cfg.mode, mps, parallel(n, mps), claim,
                             rogue=cfg.rogue))
    return plans


def _default_out(name: str, cfg: PackConfig) -> Path:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    n = "sweep" if cfg.sweep else f"n{cfg.n}"
    return Path("pack-results") / f"{name}-{cfg.framework}-{cfg.mode}-{n}-{stamp}-{os.getpid()}"
