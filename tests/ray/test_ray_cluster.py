"""memgov on a Ray cluster of 3 simulated nodes (one host, distinct inventories and ledgers).

Ray counts GPU memory through memgov.ray's requests; memgov enforces it in the workers. Nodes:
1x16 GiB, 1x80 GiB and 2x16 GiB, each with its own MEMGOV_DEVICES and MEMGOV_DIR reaching its
workers through ``add_node(env_vars=...)``. One cluster for the module (its start costs seconds).
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")

import memgov  # noqa: E402
import memgov.ray  # noqa: E402
from memgov._base.errors import BudgetExceeded, ConfigError  # noqa: E402
from memgov._gpu.devices import Device, simulated_devices  # noqa: E402
from memgov._ledger.ledger import DeviceLedger  # noqa: E402
from tests.helpers.procs import Child, wait_until  # noqa: E402
from tests.helpers.ray_nodes import declared  # noqa: E402

GIB = 2**30
NODES = {"n16": "n16g0:16GiB", "n80": "n80g0:80GiB", "n2x16": "n2g0:16GiB,n2g1:16GiB"}
CPUS_PER_NODE = 3


@dataclass
class Node:
    name: str
    spec: str
    ledger_dir: Path
    node_id: str = ""

    @property
    def env(self) -> dict[str, str]:
        return {"MEMGOV_DEVICES": self.spec, "MEMGOV_DIR": str(self.ledger_dir)}

    def devices(self) -> list[Device]:
        return simulated_devices(self.spec)

    def ledgers(self) -> list[DeviceLedger]:
        return [DeviceLedger(d, root=self.ledger_dir) for d in self.devices()]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Node]]:
    from ray.cluster_utils import Cluster

    base = tmp_path_factory.mktemp("ray-nodes")
    nodes = {name: Node(name, spec, base / name) for name, spec in NODES.items()}
    made = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    try:
        for node in nodes.values():
            resources = declared(node.env)
            handle = made.add_node(
                num_cpus=CPUS_PER_NODE,
                num_gpus=resources["num_gpus"],
                resources={**resources["resources"], f"node_{node.name}": 1},
                env_vars=node.env,
            )
            node.node_id = handle.node_id
        ray.init(address=made.address, logging_level="ERROR", log_to_driver=False)
        # The workers cannot import this test module: its task bodies travel by value.
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
        yield nodes
    finally:
        ray.shutdown()
        made.shutdown()


def _on(node: Node) -> dict[str, Any]:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node.node_id, soft=False)}


class LedgerSampler(threading.Thread):
    """Reads every node's ledgers under their admission locks; records each over-commit."""

    def __init__(self, nodes: dict[str, Node]) -> None:
        super().__init__(daemon=True)
        self.ledgers = [(n.name, ledger) for n in nodes.values() for ledger in n.ledgers()]
        self.samples = 0
        self.max_claimed: dict[str, int] = {}
        self.violations: list[str] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            for name, ledger in self.ledgers:
                with ledger.locked():
                    snap = ledger.scan(clean=False)
                uuid = ledger.device.uuid
                self.max_claimed[uuid] = max(self.max_claimed.get(uuid, 0), snap.claimed)
                if snap.claimed + snap.outside > snap.capacity:
                    self.violations.append(
                        f"{name}/{uuid}: claimed {snap.claimed} + outside "
                        f"{snap.outside} > capacity {snap.capacity}"
                    )
            self.samples += 1
            time.sleep(0.01)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(10)


def _where(hold_s: float) -> dict[str, Any]:
    """Task body: what the worker sees while it holds its claim."""
    import memgov as mg
    import memgov.ray as mr

    held = mg.current()
    assert held is not None
    info = {
        "device": held.device,
        "bytes": held.bytes,
        "pid": os.getpid(),
        "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "gpu_ids": ray.get_gpu_ids(),
        "sim": os.environ.get("MEMGOV_DEVICES"),
        "assigned": mr.assigned_device().uuid,
    }
    time.sleep(hold_s)
    return info


def test_options_are_exact_per_gpu_and_refuse_what_no_gpu_holds(cluster: dict[str, Node]) -> None:
    opts = memgov.ray.options("2GiB", gpu="16GiB")
    assert opts == {
        "num_gpus": 0.125,
        "resources": {"gpu_memory": 2048.0, "memgov_gpu_16384MiB": 0.125},
    }
    # An uneven budget rounds the fraction UP: Ray can never place more than the GPU holds.
    odd = memgov.ray.request("3000MiB", gpu="80GiB")
    assert round(odd.fraction * 10_000) == 367 and odd.fraction * 81920 >= 3000
    with pytest.raises(ConfigError, match="several GPU types"):
        memgov.ray.options("2GiB")  # mixed cluster: the type must be named
    with pytest.raises(ConfigError, match="can never fit"):
        memgov.ray.options("20GiB", gpu="16GiB")  # the 2x16 node has 32 GiB, no GPU of 20
    with pytest.raises(ConfigError, match="can never fit"):
        memgov.ray.options("81GiB", gpu="80GiB")
    with pytest.raises(ConfigError, match="no node of this cluster declares"):
        memgov.ray.options("1GiB", gpu="40GiB")


def test_mixed_budgets_pack_by_memory_and_claim_the_assigned_gpu(
    cluster: dict[str, Node],
) -> None:
    small = [4, 6, 8, 2, 12, 4, 3, 5]  # GiB, on the 16 GiB type (two nodes, three GPUs)
    large = [20, 30, 40, 50, 25, 10]  # GiB, on the 80 GiB type
    jobs = []
    for i in range(30):
        size = small[i % len(small)]
        jobs.append(memgov.ray.remote(f"{size}GiB", gpu="16GiB", num_cpus=1)(_where).remote(0.3))
    for i in range(12):
        size = large[i % len(large)]
        jobs.append(memgov.ray.remote(f"{size}GiB", gpu="80GiB", num_cpus=1)(_where).remote(0.3))
    sampler = LedgerSampler(cluster)
    sampler.start()
    try:
        results = ray.get(jobs, timeout=90)
    finally:
        sampler.stop()
    assert len(results) == 42
    print(
        f"42 tasks; {sampler.samples} ledger sweeps; peak claimed per GPU "
        f"{ {u: b / GIB for u, b in sorted(sampler.max_claimed.items())} } GiB"
    )
    assert sampler.violations == []
    assert sampler.samples > 10
    for info in results:
        # The claim is on the GPU Ray assigned: CUDA_VISIBLE_DEVICES is its position on the node.
        position = [d.uuid for d in simulated_devices(info["sim"])].index(info["device"])
        assert info["cvd"] == str(position), info
        assert [str(i) for i in info["gpu_ids"]] == [info["cvd"]]
        assert info["assigned"] == info["device"]
    used = {info["device"] for info in results}
    assert {"n16g0", "n80g0", "n2g0", "n2g1"} <= used  # every GPU got work
    # Ray's per-GPU fractions kept the ledgers within each GPU (no claim had to be refused).
    for uuid, peak in sampler.max_claimed.items():
        capacity = 80 * GIB if uuid.startswith("n80") else 16 * GIB
        assert peak <= capacity, uuid


def _attempt(markers: str, expected: int) -> str:
    """Claim 8 GiB on the assigned GPU; mark the attempt; hold until every sibling has tried."""
    import memgov.ray as mr

    try:
        held = mr.claim("8GiB")
    except BudgetExceeded:
        Path(markers, f"refused-{os.getpid()}").touch()
        raise
    Path(markers, f"admitted-{os.getpid()}").touch()
    deadline = time.monotonic() + 30
    while len(os.listdir(markers)) < expected and time.monotonic() < deadline:
        time.sleep(0.02)
    held.release()
    return "ok"


def test_outside_holder_refuses_or_queues_exactly_what_ray_over_admitted(
    cluster: dict[str, Node], tmp_path: Path
) -> None:
    node = cluster["n16"]
    # 4 GiB held outside Ray on the node's only GPU: Ray still counts 16 GiB free.
    holder = Child(["4GiB", "--hold", "stdin", "--name", "outside"], env=node.env)
    try:
        holder.expect("admitted")
        # Two 8 GiB tasks: Ray admits both at once (16 GiB by its count); the ledger has room
        # for one (12 GiB free): exactly the one Ray over-admitted is refused.
        markers = tmp_path / "refuse"
        markers.mkdir()
        remote = ray.remote(
            **memgov.ray.options("8GiB", gpu="16GiB", num_cpus=1, max_retries=0, **_on(node))
        )(_attempt)
        refs = [remote.remote(str(markers), 2) for _ in range(2)]
        outcomes = []
        for ref in refs:
            try:
                outcomes.append(ray.get(ref, timeout=60))
            except (ray.exceptions.RayTaskError, ray.exceptions.UnserializableException) as exc:
                # Until BudgetExceeded pickles (ledger branch) Ray ships it as unserialisable.
                outcomes.append("BudgetExceeded" if "BudgetExceeded" in str(exc) else repr(exc))
        assert sorted(outcomes) == ["BudgetExceeded", "ok"]
        assert sorted(p.split("-")[0] for p in os.listdir(markers)) == ["admitted", "refused"]

        # Three with wait=: the over-admitted ones queue in the ledger and run one after
        # another; the GPU never holds more than the outside 4 GiB + one 8 GiB task.
        sampler = LedgerSampler({"n16": node})
        sampler.start()
        try:
            queued = memgov.ray.remote("8GiB", gpu="16GiB", wait=60, num_cpus=1, **_on(node))(
                _where
            )
            results = ray.get([queued.remote(0.3) for _ in range(3)], timeout=90)
        finally:
            sampler.stop()
        assert len(results) == 3
        assert sampler.violations == []
        assert sampler.max_claimed["n16g0"] == 12 * GIB  # outside 4 + exactly one task
    finally:
        holder.close()


def _budget_exceeded_pickles() -> bool:
    error = BudgetExceeded("m", device="d", requested=1, free=0)
    try:
        return pickle.loads(pickle.dumps(error)).requested == 1
    except Exception:
        return False


@pytest.mark.xfail(
    not _budget_exceeded_pickles(),
    strict=True,
    reason="BudgetExceeded does not pickle yet (the fix is on the ledger branch)",
)
def test_budget_exceeded_reaches_the_driver_intact(cluster: dict[str, Node]) -> None:
    """Depends on BudgetExceeded pickling (fixed on the ledger branch): Ray ships it whole."""
    node = cluster["n16"]
    holder = Child(["16GiB", "--hold", "stdin"], env=node.env)
    try:
        holder.expect("admitted")
        task = memgov.ray.remote("1GiB", gpu="16GiB", num_cpus=1, max_retries=0, **_on(node))(
            _where
        )
        with pytest.raises(BudgetExceeded) as caught:
            ray.get(task.remote(0.0), timeout=60)
        assert caught.value.requested == GIB
        assert caught.value.free == 0
    finally:
        holder.close()


def _die_once(markers: str) -> dict[str, Any]:
    first = Path(markers, "first")
    if not first.exists():
        first.write_text(str(os.getpid()))
        time.sleep(600)  # the test kills this worker
    return {"pid": os.getpid(), "device": memgov.current().device}  # type: ignore[union-attr]


def _exited(pid: int) -> bool:
    """Every thread of the process has exited: it is gone, or only its main thread is left, a
    zombie. (A main thread can be a zombie while the others still run their exit with the
    descriptors, the claim's lock among them, open.)"""
    try:
        zombie = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
        return zombie and os.listdir(f"/proc/{pid}/task") == [str(pid)]
    except (FileNotFoundError, ProcessLookupError):
        return True


def test_killed_worker_budget_returns_at_its_death_and_retry_lands(
    cluster: dict[str, Node], tmp_path: Path
) -> None:
    node = cluster["n80"]
    (ledger,) = node.ledgers()
    task = memgov.ray.remote("30GiB", gpu="80GiB", num_cpus=1, max_retries=1, **_on(node))(
        _die_once
    )
    ref = task.remote(str(tmp_path))
    first = tmp_path / "first"
    deadline = time.monotonic() + 60
    while not (first.exists() and first.read_text()) and time.monotonic() < deadline:
        time.sleep(0.02)
    pid = int(first.read_text())
    assert [c.pid for c in ledger.snapshot().claims] == [pid]
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    # How long the kernel takes to end a large worker is the host's business; once it has, the
    # very next look finds the budget free (no lease to expire, no gc needed).
    wait_until(lambda: _exited(pid), timeout=30, period=0.005)
    assert all(c.pid != pid for c in ledger.snapshot().claims)
    print(f"killed worker's budget back in {time.monotonic() - killed:.3f} s")
    result = ray.get(ref, timeout=90)  # Ray's retry ran in a new worker and claimed again
    assert result["pid"] != pid
    assert result["device"] == "n80g0"


def _wait_in_line(hold_s: float) -> bool:
    """Claim 1 GiB on the assigned GPU; True when it did not fit at once and had to queue."""
    import memgov.ray as mr

    try:
        held = mr.claim("1GiB")
        waited = False
    except BudgetExceeded:
        held = mr.claim("1GiB", wait=60)  # the waiting path
        waited = True
    try:
        time.sleep(hold_s)
    finally:
        held.release()
    return waited


def test_no_worker_aborts_over_200_waiting_claims(cluster: dict[str, Node]) -> None:
    node = cluster["n16"]
    # 15 of the GPU's 16 GiB held outside Ray: one 1 GiB claim at a time, the rest queue.
    holder = Child(["15GiB", "--hold", "stdin"], env=node.env)
    try:
        holder.expect("admitted")
        task = ray.remote(
            **memgov.ray.options("1GiB", gpu="16GiB", num_cpus=1, max_calls=0, **_on(node))
        )(_wait_in_line)
        waited = sum(ray.get([task.remote(0.05) for _ in range(300)], timeout=150))
    finally:
        holder.close()
    print(f"{waited} of 300 claims took the waiting path")
    assert waited >= 200, waited
    # The workers that ran this test's task: the cluster is shared with earlier tests, whose
    # options() tasks keep Ray's max_calls=1 for GPU tasks, and one of those workers may abort
    # as it exits (Ray's own abort, also without memgov: docs/ray.md, Limits).
    logs = ray._private.worker._global_node.get_logs_dir_path()
    texts = {
        path: Path(path).read_text(errors="replace") for path in glob.glob(f"{logs}/worker-*.err")
    }
    ours = {path: text for path, text in texts.items() if ":task_name:_wait_in_line" in text}
    assert ours, "no worker log names this test's task"
    aborted = [path for path, text in ours.items() if "Mutex corrupt" in text or "SIGABRT" in text]
    assert aborted == []


@pytest.fixture(autouse=True)
def _no_stray_claims() -> Iterator[None]:
    yield
    with contextlib.suppress(Exception):
        held = memgov.current()
        if held is not None:
            held.release()


def _memgov_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    memgov_bin = Path(sys.executable).with_name("memgov")
    return subprocess.run(
        [str(memgov_bin), *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def test_status_across_the_cluster_shows_every_node_ledger(cluster: dict[str, Node]) -> None:
    address = ray.get_runtime_context().gcs_address
    holder = Child(["3GiB", "--hold", "stdin", "--name", "outside-80"], env=cluster["n80"].env)
    try:
        holder.expect("admitted")
        shown = _memgov_cli("ray", "status", "--address", address, "--json")
    finally:
        holder.close()
    assert shown.returncode == 0, shown.stderr
    nodes = {n["node_id"]: n for n in json.loads(shown.stdout)["nodes"]}
    for node in cluster.values():
        seen = nodes[node.node_id]
        assert seen["memgov_dir"] == str(node.ledger_dir)
        assert [d["uuid"] for d in seen["devices"]] == [d.uuid for d in node.devices()]
    (n80,) = nodes[cluster["n80"].node_id]["devices"]
    assert [(c["name"], c["bytes"]) for c in n80["claims"]] == [("outside-80", 3 * GIB)]


def test_pack_over_the_cluster_reports_per_job_gpu_and_node(cluster: dict[str, Node]) -> None:
    address = ray.get_runtime_context().gcs_address
    mnist = Path(__file__).resolve().parents[2] / "experiments" / "mnist"
    shown = _memgov_cli(
        "ray", "pack", str(mnist), "--address", address, "--n", "3", "--claim", "1GiB",
        "--gpu", "16GiB", "--device", "cpu", "--epochs", "1", "--json",
        "--", "--limit", "64", "--eval-limit", "64", timeout=240,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stdout[-2000:] + shown.stderr[-2000:]
    report = json.loads(shown.stdout)
    assert report["ok"] == 3 and report["failed"] == 0
    assert report["ray_options"]["num_gpus"] == 0.0625
    for job in report["jobs"]:
        # The trainer's own auto-enable claimed 1 GiB on the GPU Ray assigned to its task.
        assert job["claim_line"] is not None and f"1.00 GiB on {job['gpu']} " in job["claim_line"]
        assert job["gpu"] in {"n16g0", "n2g0", "n2g1"}
    assert sum(row["jobs"] for row in report["per_gpu"]) == 3
    assert sum(row["jobs"] for row in report["per_node"]) == 3


class _Holder:
    """An actor that keeps its budget for its life."""

    def where(self) -> tuple[str | None, str | None]:
        held = memgov.current()
        return (held.device if held else None), os.environ.get("CUDA_VISIBLE_DEVICES")


def test_actor_holds_its_budget_for_life_and_gives_it_back_when_killed(
    cluster: dict[str, Node],
) -> None:
    node = cluster["n2x16"]
    actor_class = memgov.ray.remote("12GiB", gpu="16GiB", num_cpus=0, **_on(node))(_Holder)
    actors = [actor_class.remote() for _ in range(2)]
    places = ray.get([a.where.remote() for a in actors], timeout=60)
    # 12 GiB twice on a node of 2x16 GiB: Ray put them on different GPUs, each claimed there.
    assert sorted(places) == [("n2g0", "0"), ("n2g1", "1")]
    claimed = {ledger.device.uuid: ledger.snapshot().claimed for ledger in node.ledgers()}
    assert claimed == {"n2g0": 12 * GIB, "n2g1": 12 * GIB}
    for actor in actors:
        ray.kill(actor)
    deadline = time.monotonic() + 10
    while any(ledger.snapshot().claims for ledger in node.ledgers()):
        assert time.monotonic() < deadline, "a killed actor's budget stayed claimed"
        time.sleep(0.02)


def _count_attempts(markers: str) -> int:
    Path(markers, f"attempt-{time.time_ns()}").touch()
    held = memgov.current()
    assert held is not None
    return len(os.listdir(markers))


def test_a_refused_claim_is_retried_by_ray_until_it_fits(
    cluster: dict[str, Node], tmp_path: Path
) -> None:
    node = cluster["n80"]
    holder = Child(["80GiB", "--hold", "stdin"], env=node.env)
    try:
        holder.expect("admitted")
        task = memgov.ray.remote("10GiB", gpu="80GiB", num_cpus=1, max_retries=-1, **_on(node))(
            _count_attempts
        )
        ref = task.remote(str(tmp_path))
        time.sleep(1.0)  # Ray's attempts meanwhile end in BudgetExceeded, which it retries
        assert list(tmp_path.iterdir()) == []
    finally:
        freeing = time.time_ns()
        holder.close()  # the outside memory is freed: the next attempt's claim fits
    assert ray.get(ref, timeout=60) >= 1
    # The body ran only once the claim was admitted, once the memory was being freed. (It ran
    # twice once on a loaded machine, not looked into further; Ray runs a task again when its
    # worker dies after the body, and a second run must come after too.)
    ran = [int(p.name.split("-")[1]) for p in tmp_path.iterdir()]
    assert ran and all(at > freeing for at in ran)
