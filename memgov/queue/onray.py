"""The queue past one machine: ``memgov queue run --ray ADDRESS FILE``.

No scheduler of memgov's own across machines: the policy chooses the GPU as it does on one host,
and Ray runs the task there. Each decision is the local engine's (memgov/queue/engine.py) over a
View of the cluster's GPUs: each GPU's free budget from the nodes' ledgers (sampled once a
second, less what the queue placed since) and the queue's jobs on it. A placed job becomes a Ray
task pinned to its GPU's node (Ray's ``NodeAffinitySchedulingStrategy``, not soft) that asks for
its GPU memory through memgov.ray (``num_gpus`` = budget / the node's GPU type, plus the
``gpu_memory`` and type resources the nodes declare: docs/ray.md), so Ray's counts stay right;
the exclusive policies ask for whole GPUs. Inside the worker the command runs governed like
``memgov run`` on the GPU the policy chose (MEMGOV_DEVICE; CUDA_VISIBLE_DEVICES names it, not
the GPU Ray's count assigned on that node), with its budget in the node's ledger (the worker's
MEMGOV_DIR) and MEMGOV_WAIT: where a claim from outside the queue took the room after the
sample, the job waits for it as a local job does. Ray's own per-GPU count may hold a pinned task
until a task on its node ends; the claim still goes to the chosen GPU.

A budget of ``auto`` is sized in the driver from the job's profile (memgov.ray's rule: Ray
needs a number before it schedules); each attempt's profile run, recorded on its node, comes back
with its result and is added to the driver's profile store, so the next ``auto`` is sized from
it.

How an attempt ended and what follows is the local runner's rule (memgov/queue/ends.py): an OOM
under a learned size is submitted again 1.5 x larger, at most twice, counted. The report is the
local one (memgov/queue/report.py): GPU memory over time comes from one small actor per node
that reads its GPUs' ledgers (and NVML) once a second; ``gpu`` numbers the cluster's GPUs.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memgov import decide
from memgov._base.errors import ConfigError, MemgovError, QueueError
from memgov._gpu.devices import Device
from memgov.queue import ends
from memgov.queue.model import FINISHED, Attempt, Job
from memgov.queue.queuefile import JobSpec, load
from memgov.queue.report import Report, Sampler, build_report, reading
from memgov.queue.runner import STOP_SIGNALS, WAIT_BUDGET_S, _Stop
from memgov.queue.store import Store
from memgov.queue.submit import to_job

MIB = 2**20
NODE_VARIABLES = ("MEMGOV_DIR", "MEMGOV_DEVICES", "CUDA_VISIBLE_DEVICES")
"""The worker's own (the node's ledger and GPUs, Ray's GPU choice), never the driver's."""
OUTPUT_TAIL = 16 * 1024
"""The bytes of a job's output that come back (OOM markers are looked for in them)."""
STOP_GRACE_S = 10.0
"""A cancelled task's command gets SIGTERM, then SIGKILL after this many seconds."""
STOP_WAIT_S = STOP_GRACE_S + 20
"""How long a stopping driver waits for its cancelled tasks to answer."""
POLL_S = 0.2
DESCRIBE_TIMEOUT_S = 120.0
"""How long the nodes' readers may take to start; a node whose reader did not is not sampled
and its GPUs have no number in the report (gpu -1)."""
READ_TIMEOUT_S = 10.0
"""When a node does not answer in this time, that sample is skipped (the run goes on)."""


# -- in the workers -----------------------------------------------------------------------------


def run_job(orders: dict[str, Any]) -> dict[str, Any]:
    """The task body: run one job's command on the GPU the policy chose (``orders["device"]``,
    on this node); how it ended, and the run its claim recorded in the node's profile store
    (its peak; ``end: oom``)."""
    import ray

    where = {
        "device": orders["device"],
        "node_id": ray.get_runtime_context().get_node_id(),
        "node": socket.gethostname(),
        "start": time.time(),
    }
    try:
        env = _job_env(orders, orders["device"])
    except MemgovError as exc:  # the chosen GPU is not on this node: nothing ran
        return {**where, "end": time.time(), "returncode": None, "pid": None, "tail": str(exc)}
    try:
        proc = subprocess.Popen(
            orders["cmd"],
            cwd=orders["cwd"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
    except OSError as exc:  # as the local shepherd says it: the job failed, nothing ran
        detail = f"cannot start {orders['cmd'][0]!r}: {exc.strerror or exc}"
        return {**where, "end": time.time(), "returncode": None, "pid": None, "tail": detail}
    output = _wait(proc)
    return {
        **where,
        "end": time.time(),
        "returncode": proc.returncode,
        "pid": proc.pid,
        "tail": output[-OUTPUT_TAIL:].decode(errors="replace"),
        "run": ends.profile_run(orders["job"], proc.pid),
    }


def _wait(proc: subprocess.Popen[bytes]) -> bytes:
    """The command's output once it ended. Waits in short steps: Ray cancels a task by raising
    KeyboardInterrupt in it, which lands between them; the command then stops with the task."""
    try:
        while True:
            with contextlib.suppress(subprocess.TimeoutExpired):
                return proc.communicate(timeout=POLL_S)[0]
    except BaseException:
        proc.terminate()
        try:
            proc.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        raise


def _job_env(orders: dict[str, Any], device: str) -> dict[str, str]:
    """The job's environment: the driver's, with the node's own ledger and GPUs, governed as the
    local runner governs its jobs (memgov/_run.py: its budget on ``device``, MEMGOV_WAIT).

    Ray's ``num_gpus`` count set CUDA_VISIBLE_DEVICES to a GPU of its own choice on this node;
    the job sees the chosen one instead (its UUID; simulated GPUs ignore the variable)."""
    from memgov import _run

    base = dict(orders["env"])
    for name in NODE_VARIABLES:
        if name in os.environ:
            base[name] = os.environ[name]
        else:
            base.pop(name, None)
    budget = str(orders["budget"])
    with _visible(device):  # command_env checks the device against what CMD will see
        env = _run.command_env(budget, device, WAIT_BUDGET_S, False, None, base, orders["job"])
    if not _simulated():
        env["CUDA_VISIBLE_DEVICES"] = device
    return env


def _simulated() -> bool:
    from memgov._gpu import devices as _devices

    return _devices.simulated_spec() is not None


@contextlib.contextmanager
def _visible(device: str) -> Iterator[None]:
    """This worker sees only ``device`` while inside (real GPUs); restored after: Ray reuses
    the worker and sets the variable for each of its tasks."""
    if _simulated():
        yield
        return
    saved = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = device
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = saved


class NodeGpus:
    """A Ray actor on one node: its GPUs, and their memory when asked (the report's samples)."""

    def __init__(self) -> None:
        from memgov._gpu import devices as _devices

        try:
            self.devices = _devices.devices()
        except MemgovError:
            self.devices = []

    def describe(self) -> dict[str, Any]:
        import ray

        return {
            "node_id": ray.get_runtime_context().get_node_id(),
            "node": socket.gethostname(),
            "gpus": [(d.uuid, d.name, d.total, d.simulated) for d in self.devices],
        }

    def read(self) -> list[dict[str, Any]]:
        return [{**reading(d), "uuid": d.uuid, "free": _free(d)} for d in self.devices]


def _free(device: Device) -> int:
    """The budget the device's ledger admits now (0 while its ledger cannot be read)."""
    from memgov._ledger.ledger import DeviceLedger

    try:
        return DeviceLedger(device).snapshot().free
    except Exception:  # busy past its lock bound: nothing is placed there this sample
        return 0


# -- the cluster's GPUs, as the report numbers them ---------------------------------------------


@dataclass
class Cluster:
    types: list[int]
    """The GPU types' capacities (MiB), smallest first."""
    readers: list[Any] = field(default_factory=list)
    devices: list[Device] = field(default_factory=list)
    """Every memgov GPU of the cluster; ``index`` numbers them across the nodes."""
    index: dict[tuple[str, str], int] = field(default_factory=dict)
    """(node id, GPU uuid) -> the GPU's index."""
    nodes: dict[int, str] = field(default_factory=dict)
    """The GPU's index -> its node (host name and the start of Ray's node id)."""
    reader_nodes: list[str] = field(default_factory=list)
    """The node id of each reader, in ``readers``' order."""
    node_ids: dict[int, str] = field(default_factory=dict)
    """The GPU's index -> Ray's id of its node (where its jobs are pinned)."""
    capacity: dict[int, int] = field(default_factory=dict)
    """The GPU's index -> the budget it holds (bytes): its node's GPU type, as Ray counts it."""
    free: dict[int, int] = field(default_factory=dict)
    """The GPU's index -> the free budget its ledger admitted at the last sample (bytes)."""

    def gpu(self, node_id: str, uuid: str) -> int:
        return self.index.get((node_id, uuid), -1)

    def read(self) -> list[dict[str, Any]] | None:
        """Every GPU's reading now (numbered as ``devices``); None when a node did not answer."""
        import ray

        try:
            answers = ray.get([r.read.remote() for r in self.readers], timeout=READ_TIMEOUT_S)
        except Exception:  # a node lost or slow: this sample is skipped, the run goes on
            return None
        readings = []
        for node_id, found in zip(self.reader_nodes, answers, strict=True):
            for entry in found:
                uuid, free = entry.pop("uuid"), entry.pop("free")
                index = self.gpu(node_id, uuid)
                if index >= 0:
                    self.free[index] = int(free)
                readings.append({**entry, "gpu": index})
        return sorted(readings, key=lambda r: int(r["gpu"]))


def discover(types: list[int]) -> Cluster:
    """One NodeGpus actor on every alive node that declares memgov GPUs; their GPUs numbered."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from memgov.ray._request import type_capacity

    cluster = Cluster(sorted(types))
    actor = ray.remote(num_cpus=0, max_restarts=0)(NodeGpus)
    readers: list[Any] = []
    node_types: dict[str, int] = {}
    for node in ray.nodes():
        resources = node.get("Resources", {})
        declared = [c for c in map(type_capacity, resources) if c]
        if not node.get("Alive") or not declared:
            continue
        node_types[node["NodeID"]] = min(declared)  # one type per node (memgov/ray/_node.py)
        strategy = NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
        readers.append(actor.options(scheduling_strategy=strategy).remote())
    asked = {r.describe.remote(): r for r in readers}
    answered, _ = ray.wait(list(asked), num_returns=len(asked), timeout=DESCRIBE_TIMEOUT_S)
    for ref, reader in asked.items():
        try:
            node = ray.get(ref, timeout=0) if ref in answered else None
        except Exception:  # a node that cannot host the reader: its GPUs are left unnumbered
            node = None
        if node is None:
            with contextlib.suppress(Exception):
                ray.kill(reader)
            continue
        where = f"{node['node']} ({node['node_id'][:8]})"
        cluster.readers.append(reader)
        cluster.reader_nodes.append(node["node_id"])
        for uuid, name, total, simulated in node["gpus"]:
            index = len(cluster.devices)
            cluster.devices.append(Device(index, uuid, name, total, 0, simulated, None))
            cluster.index[(node["node_id"], uuid)] = index
            cluster.nodes[index] = where
            cluster.node_ids[index] = node["node_id"]
            cluster.capacity[index] = node_types.get(node["node_id"], 0) * MIB
    # Jobs are sized and refused against the GPUs numbered here (a node whose reader did not
    # answer gets no job), not against every type the cluster declares.
    cluster.types = sorted({c // MIB for c in cluster.capacity.values() if c})
    return cluster


# -- the driver ---------------------------------------------------------------------------------


def run_on_ray(
    file: str | os.PathLike[str] | list[JobSpec] | None,
    address: str,
    policy: str | decide.Policy | None = None,
    solo: str | os.PathLike[str] | dict[str, float] | None = None,
    store: Store | None = None,
    max_slowdown: float | None = None,
) -> Report:
    """Run a queue file's jobs as Ray tasks on the cluster at ``address``; the report.
    ``policy``: a policy's name (memgov/decide/policies.py), or a policy object of one's own.

    What the run teaches (solo times, slowdowns) is kept in the user's queue store
    (``learned.json``, as the local runner keeps it), and each attempt's profile run in the
    driver's profile store."""
    import ray

    from memgov.queue import _solo
    from memgov.ray._request import cluster_types

    if file is None:
        raise ConfigError("--ray runs a queue file: memgov queue run --ray ADDRESS FILE")
    specs, file_policy = (file, None) if isinstance(file, list) else _specs(file)
    if isinstance(policy, str | None):
        chosen = decide.get(policy or file_policy, max_slowdown)
    else:
        chosen = policy  # a policy object of one's own
    if not ray.is_initialized():
        ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
    types = cluster_types(ray.cluster_resources())
    if not types:
        raise ConfigError(
            f"the Ray cluster at {address} declares no memgov GPU types: start its nodes with "
            "the resources `memgov ray node-resources` prints (docs/ray.md)"
        )
    store = store or Store()
    learned = decide.Learned.from_json(store.read_extra("learned.json"))
    started = time.time()
    jobs = [to_job(s, dict(os.environ), "ray", started) for s in specs]
    for number, job in enumerate(jobs, 1):
        job.id = number
    cluster = discover(types)
    if not cluster.types:
        raise ConfigError(
            f"no node of the Ray cluster at {address} answered with its GPUs within "
            f"{DESCRIBE_TIMEOUT_S:.0f} s (each node with memgov GPU resources runs a reader)"
        )
    try:
        report = RayQueue(jobs, chosen, cluster, _solo(solo), learned, started).run()
    finally:
        for reader in cluster.readers:
            with contextlib.suppress(Exception):
                ray.kill(reader)
    store.write_extra("learned.json", learned.to_json())
    return report


def _specs(file: str | os.PathLike[str]) -> tuple[list[JobSpec], str | None]:
    parsed = load(Path(file))
    return parsed.jobs, parsed.policy


def _catch(stop: _Stop) -> dict[int, Any]:
    """Route the stop signals to ``stop`` (only the main thread may); the handlers it replaced."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.signal(sig, stop) for sig in STOP_SIGNALS}


class RayQueue:
    """The engine's front end on Ray: decides where the due jobs run (the policy, over the
    cluster's GPUs), submits each placed job pinned to its GPU's node, follows them to their
    end; the engine's loop (Engine.run) drives it, waiting on Ray, not on a host's store."""

    def __init__(
        self,
        jobs: list[Job],
        policy: decide.Policy,
        cluster: Cluster,
        solo: dict[str, float],
        learned: decide.Learned,
        started: float,
    ) -> None:
        import ray

        from memgov.queue.engine import Engine

        self.jobs = jobs
        self.policy = policy
        self.cluster = cluster
        self.solo = solo
        self.learned = learned
        self.started = started
        self.pending: dict[Any, tuple[Job, Attempt]] = {}
        cores = int(ray.cluster_resources().get("CPU", 0)) or None
        self.engine = Engine(self, policy, cores=cores)
        self.latencies = self.engine.latencies
        self.changed = True
        """Something happened that a decision should see (an end, an arrival, a sample)."""
        self.sampled_ours: dict[int, int] = {}
        """The queue's budgets on each GPU when the last sample was taken (bytes)."""
        self.seen: set[int] = set()
        """The jobs a decision has seen due (a new one makes the next decision due)."""
        self.spans: list[ends.Span] = []
        self.sampler = Sampler(cluster.devices)
        # max_retries=0: a lost worker is a lost attempt, never a second run of the command;
        # max_calls=0: workers are reused (one leaving after each call may abort: docs/ray.md).
        self.task = ray.remote(max_retries=0, max_calls=0)(run_job)
        self.stop = _Stop()

    def run(self) -> Report:
        saved = _catch(self.stop)
        try:
            self._sample(force=True)  # the GPUs' free budget before the first decision
            # after a signal (or an error) the engine has halt() cancel what runs
            self.engine.run(lambda: self.stop.signal is not None)
        finally:
            for sig, handler in saved.items():
                signal.signal(sig, handler)
        self._sample(force=True)
        self._learn()
        report = build_report(
            self.policy,
            self.jobs,
            self.latencies,
            self.sampler,
            self.cluster.devices,
            self.solo,
            self.learned,
            self.started,
            nodes=self.cluster.nodes,
            held=(self.engine.held, self.engine.held_count),
        )
        report.interrupted = self.stop.signal
        return report

    def follow(self) -> bool:
        """A sample when one is due; False once every job has finished."""
        self._sample()
        return any(j.state not in FINISHED for j in self.jobs)

    def wait(self) -> None:
        """Until a task ends (taken here), the next sample or the next arrival."""
        import ray

        until = min(self.sampler.next_in(), max(0.01, self._next_arrival() - time.time()))
        if not self.pending:
            time.sleep(until)
            return
        done, _ = ray.wait(list(self.pending), num_returns=1, timeout=until)
        for ref in done:
            self._finish(ref)

    def halt(self, error: BaseException | None) -> None:
        self._stop_all()

    def _stop_all(self) -> None:
        """Cancel every submitted task: its command gets SIGTERM, SIGKILL after STOP_GRACE_S;
        its attempt ends ``stopped`` (the job is not finished: a next run runs it)."""
        import ray

        if not self.pending:
            return
        for ref in self.pending:
            with contextlib.suppress(Exception):
                ray.cancel(ref)
        done, _ = ray.wait(list(self.pending), num_returns=len(self.pending), timeout=STOP_WAIT_S)
        for ref in done:
            self._finish(ref)
        for job, attempt in self.pending.values():  # no answer: its node may be gone
            attempt.end, attempt.result = time.time(), "lost"
            attempt.detail = "its Ray task did not answer the cancel"
            ends.settle(job, attempt)
        self.pending.clear()

    # -- deciding (the engine's front end) -------------------------------------------------------

    def view(self, now: float) -> tuple[list[decide.Candidate], list[decide.Gpu]] | None:
        """The queued jobs that have arrived, each with its budget, and the cluster's GPUs; None
        when nothing changed since the last decision."""
        due = [j for j in self.jobs if j.state == "queued" and j.not_before <= now]
        arrived = {j.id for j in due} - self.seen
        if not due or not (self.changed or arrived):
            return None
        self.changed = False
        self.seen |= arrived
        candidates = []
        for job in due:
            try:
                claim = budget(job, self.cluster.types, self.policy)[0]
            except MemgovError as exc:
                ends.never(job, str(exc), time.time())
                continue
            expected = self.learned.expected(job.job, job.kind, job.duration)
            util = self.learned.util.get(job.job, 1.0)
            candidates.append(
                decide.Candidate(job.id, job.kind, claim, expected, None, util, job.not_before)
            )
        return candidates, self._gpus()

    def _gpus(self) -> list[decide.Gpu]:
        """Each GPU's free budget: what its ledger admitted at the last sample, less the
        queue's budgets placed there since (those it held then are in the sample already)."""
        running: dict[int, list[decide.Running]] = {i: [] for i in self.cluster.capacity}
        for job, attempt in self.pending.values():
            running.setdefault(attempt.gpu, []).append(
                decide.Running(
                    job.id,
                    job.kind,
                    attempt.claim_bytes,
                    attempt.start,
                    self.learned.expected(job.job, job.kind, job.duration),
                    self.learned.util.get(job.job, 1.0),
                )
            )
        gpus = []
        for index, capacity in sorted(self.cluster.capacity.items()):
            ours = sum(r.claim for r in running[index])
            held = capacity - self.cluster.free.get(index, capacity)  # by anyone, at the sample
            outside = max(0, held - self.sampled_ours.get(index, 0))
            free = max(0, capacity - outside - ours)
            gpus.append(decide.Gpu(index, capacity, free, running[index]))
        return gpus

    def start(self, job_id: int, gpu: int, claim: int) -> None:
        (job,) = [j for j in self.jobs if j.id == job_id]
        if getattr(self.policy, "exclusive", False):
            claim = self.cluster.capacity[gpu]  # the whole GPU the policy chose
        self._submit(job, claim, gpu)

    def refuse(self, job_id: int, why: str) -> None:
        (job,) = [j for j in self.jobs if j.id == job_id]
        ends.never(job, why, time.time())

    def held(self, waiting: list[decide.Candidate]) -> None:
        """Jobs that wait stay queued: the next decision (an end, a sample) sees them again."""

    def active(self) -> int:
        return len(self.pending)

    def _submit(self, job: Job, claim: int, gpu: int) -> None:
        """The job as a Ray task on the node of ``gpu``, which its command claims on."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        import memgov.ray as mray

        node_id = self.cluster.node_ids[gpu]
        device = self.cluster.devices[gpu].uuid
        pin = NodeAffinitySchedulingStrategy(node_id, soft=False)
        capacity = self.cluster.capacity[gpu] // MIB
        opts = mray.options(claim, gpu=f"{capacity}MiB", num_cpus=1, scheduling_strategy=pin)
        orders = {
            "cmd": job.cmd,
            "cwd": job.cwd,
            "env": job.env,
            "budget": claim,
            "job": job.job,
            "device": device,
        }
        ref = self.task.options(**opts).remote(orders)
        attempt = Attempt(len(job.attempts) + 1, claim, gpu, device, "", start=time.time())
        job.attempts.append(attempt)
        job.state = "running"
        self.pending[ref] = (job, attempt)

    def _next_arrival(self) -> float:
        """The next queued job's arrival still ahead (a due job waiting for room is woken by a
        task's end or a sample, not by polling)."""
        now = time.time()
        ahead = (j.not_before for j in self.jobs if j.state == "queued" and j.not_before > now)
        return min(ahead, default=math.inf)

    # -- ends -----------------------------------------------------------------------------------

    def _finish(self, ref: Any) -> None:
        import ray

        job, attempt = self.pending.pop(ref)
        self.changed = True
        try:
            result = ray.get(ref)
        except Exception as exc:  # cancelled; or the worker or its node died mid-run
            attempt.end, attempt.gpu = time.time(), -1  # when it ran, and where, is unknown
            if self.stop.signal is not None or isinstance(exc, ray.exceptions.TaskCancelledError):
                attempt.result, attempt.detail = "stopped", "the driver stopped: not finished"
            else:  # whether it finished is unknown: never run twice
                attempt.result, attempt.detail = "lost", f"its Ray task failed: {exc}"[:300]
            ends.settle(job, attempt)
            return
        run = result.get("run")
        attempt.start, attempt.end = float(result["start"]), float(result["end"])
        attempt.gpu = self.cluster.gpu(result["node_id"], result["device"])
        attempt.device, attempt.pid = result["device"], result["pid"]
        attempt.returncode = result["returncode"]
        attempt.peak_bytes = ends.peak_of(run)
        end, detail = ends.by_exit(
            attempt.returncode, lambda: ends.ran_out(run, result["tail"]), result["tail"][-300:]
        )
        where = self.cluster.nodes.get(attempt.gpu, result["node"])
        attempt.result, attempt.detail = end, f"node {where}" + (f"; {detail}" if detail else "")
        self.spans.append((job.id, job.kind, attempt.gpu, attempt.start, attempt.end))
        remember(job, run)
        ends.settle(job, attempt)  # an OOM under a learned size: queued again, larger

    def _learn(self) -> None:
        """Every attempt's sharing and what it teaches, in the order they ended (a task's start is
        known only at its end, so this waits for the whole timeline)."""
        attempts = [(a, j) for j in self.jobs for a in j.attempts if a.gpu >= 0]
        for attempt, job in sorted(attempts, key=lambda p: p[0].end or 0.0):
            ends.learn_from(self.learned, job, attempt, self.spans, self.solo)

    # -- samples --------------------------------------------------------------------------------

    def _sample(self, force: bool = False) -> None:
        if not (force or self.sampler.due()):
            return
        ours: dict[int, int] = {}
        for _job, attempt in self.pending.values():
            ours[attempt.gpu] = ours.get(attempt.gpu, 0) + attempt.claim_bytes
        readings = self.cluster.read()
        if readings is not None:
            self.sampled_ours = ours
            self.sampler.add(readings)
            self.changed = True  # room taken or freed outside the queue shows here


def budget(job: Job, types: list[int], policy: decide.Policy) -> tuple[int, int]:
    """The job's next budget (bytes) and the GPU type (capacity, MiB) it is asked on: the
    smallest type that holds it. QueueError when no GPU of the cluster can."""
    from memgov._base.sizes import Size
    from memgov.ray._request import auto_budget

    claim = job.next_claim or job.claim  # after an OOM: the grown size (memgov/queue/ends.py)
    fits = [t for t in types if not isinstance(claim, int) or t * MIB >= claim]
    if not fits:
        raise QueueError(
            f"claim {int(claim) / 2**30:.2f} GiB is more than any GPU of the cluster holds "
            f"({types[-1] / 1024:.2f} GiB of budget)"
        )
    capacity = fits[0]
    if getattr(policy, "exclusive", False):
        return capacity * MIB, capacity  # one job per GPU
    if job.claim == "auto":  # after an OOM: grown, or the peak a sibling's run taught since
        learned = auto_budget(job.job, capacity)[0]
        return (max(job.next_claim, learned) if job.next_claim else learned), capacity
    if isinstance(claim, str):
        return Size(claim, "claim").on(capacity * MIB), capacity
    return claim, capacity


def remember(job: Job, run: dict[str, Any] | None) -> None:
    """Add the attempt's profile run (recorded on its node) to the driver's profile store, which
    sizes the job's next ``auto`` budget; a run that is there already (the driver shares the
    node's store) is not added twice. A bad store only leaves the size unlearned."""
    from memgov._profiles import store as _profiles

    if run is None:
        return
    with contextlib.suppress(MemgovError):
        known = _profiles.read(job.job)
        same = ("pid", "time")
        if known and any(all(r.get(k) == run.get(k) for k in same) for r in known.runs):
            return
        _profiles.record(job.job, job.name, [run], " ".join(job.cmd))


__all__ = ["NodeGpus", "budget", "remember", "run_job", "run_on_ray"]
