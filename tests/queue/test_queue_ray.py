"""The queue on a Ray cluster of 3 simulated nodes (one host; tests/ray's layout): every job
lands on a GPU with room, none is over budget, an OOM under a learned size is run again larger
(counted, its size learned), and the report has the local report's figures."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")

import numpy as np  # noqa: E402

import memgov.queue as q  # noqa: E402
import memgov.ray  # noqa: E402
from memgov import decide  # noqa: E402
from memgov._gpu.devices import simulated_devices  # noqa: E402
from memgov._ledger.ledger import DeviceLedger  # noqa: E402
from memgov._profiles import autosize as _autosize, store as _profiles  # noqa: E402
from memgov.decide.policies import Fifo  # noqa: E402
from memgov.queue import engine as engine_module  # noqa: E402
from memgov.queue.model import Job  # noqa: E402
from memgov.queue.onray import discover, remember, run_on_ray  # noqa: E402
from memgov.ray._request import cluster_types  # noqa: E402
from tests.helpers.queuejobs import GIB, ROOT, memgov_cli, write_queue  # noqa: E402
from tests.helpers.ray_nodes import declared  # noqa: E402

NODES = {"n16": "n16g0:16GiB", "n80": "n80g0:80GiB", "n2x16": "n2g0:16GiB,n2g1:16GiB"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    from ray.cluster_utils import Cluster

    base = tmp_path_factory.mktemp("ray-queue")
    ledgers = {name: base / name for name in NODES}
    made = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    try:
        for name, spec in NODES.items():
            env = {"MEMGOV_DEVICES": spec, "MEMGOV_DIR": str(ledgers[name])}
            resources = declared(env)
            made.add_node(
                num_cpus=3,
                num_gpus=resources["num_gpus"],
                resources=resources["resources"],
                env_vars=env,
            )
        ray.init(address=made.address, logging_level="ERROR", log_to_driver=False)
        yield ledgers
    finally:
        ray.shutdown()
        made.shutdown()


class Watch(threading.Thread):
    """Every node's ledger, read under its lock: the most claimed, and any over-commit."""

    def __init__(self, ledgers: dict[str, Path]) -> None:
        super().__init__(daemon=True)
        self.ledgers = [
            DeviceLedger(d, root=ledgers[n])
            for n, spec in NODES.items()
            for d in simulated_devices(spec)
        ]
        self.most: dict[str, int] = {}
        self.over: list[str] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            for ledger in self.ledgers:
                if not ledger.path.is_dir():
                    continue
                with ledger.locked():
                    snap = ledger.scan(clean=False)
                uuid = ledger.device.uuid
                self.most[uuid] = max(self.most.get(uuid, 0), snap.claimed)
                if snap.claimed > snap.capacity:
                    self.over.append(f"{uuid}: {snap.claimed} > {snap.capacity}")
            time.sleep(0.02)


def claimer(seconds: float) -> list[str]:
    """A job that claims its budget on its GPU and holds it; it fails (exit 3) unless it runs
    governed as a local queue job does (MEMGOV_WAIT: a holder outside the queue is waited for)."""
    code = (
        "import os, sys, time, memgov\n"
        "if os.environ.get('MEMGOV_WAIT') != '600': sys.exit(3)\n"
        "c = memgov.claim(int(os.environ['MEMGOV_CLAIM']), device=os.environ['MEMGOV_DEVICE'])\n"
        f"time.sleep({seconds})\n"
    )
    return [sys.executable, "-c", code]


def watched(cluster: dict[str, Path], path: Path, policy: str) -> dict[str, Any]:
    """The report of ``path`` run on the cluster; asserts no ledger was ever over-committed."""
    watch = Watch(cluster)
    watch.start()
    try:
        report = run_on_ray(path, "auto", policy=policy).to_json()
    finally:
        watch.done.set()
        watch.join(10)
    assert watch.over == []
    assert max(watch.most.values()) > 0  # the jobs' claims were in the nodes' ledgers
    return report


def assert_on_gpus_with_room(report: dict[str, Any]) -> None:
    """Every attempt that ran is on one of the cluster's GPUs, within its memory; at no sample
    does any GPU hold more claims than it has."""
    totals = {d["index"]: d["total_bytes"] for d in report["devices"]}
    assert len(totals) == 4 and all(d["node"] for d in report["devices"])
    for row in report["jobs"]:
        if row["start_s"] is not None and row["gpu"] >= 0:
            assert row["claim_bytes"] <= totals[row["gpu"]], row
    assert report["samples"]
    for sample in report["samples"]:
        assert sorted(g["gpu"] for g in sample["gpus"]) == sorted(totals)
        for gpu in sample["gpus"]:
            assert 0 <= gpu["claimed_bytes"] <= totals[gpu["gpu"]], sample
        assert sample["claimed_bytes"] == sum(g["claimed_bytes"] for g in sample["gpus"])


@pytest.mark.parametrize("policy", ["memgov", "sjf-exclusive", "fgd", "tetris"])
def test_a_queue_runs_on_ray_every_job_on_a_gpu_with_room(
    cluster: dict[str, Path], tmp_path: Path, policy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    scored: list[str] = []  # the driver scores with the registry's class (memgov/decide/)
    base: Any = decide.POLICIES[policy]

    def score(self: Any, *args: Any) -> Any:
        scored.append(self.name)
        return base.score(self, *args)

    monkeypatch.setitem(decide.POLICIES, policy, type("Spy", (base,), {"score": score}))
    sizes = [4, 6, 8, 2, 12, 4, 30, 50, 3, 5]
    jobs: list[dict[str, Any]] = [
        {
            "name": f"j{i}",
            "cmd": claimer(0.3),
            "claim": f"{s}GiB",
            "kind": "big" if s > 16 else "small",
            "duration": 0.3,
        }
        for i, s in enumerate(sizes)
    ]
    report = watched(cluster, write_queue(tmp_path / "q.toml", jobs), policy)
    assert [j["end"] for j in report["jobs"]] == ["ok"] * len(sizes), report["jobs"]
    rows = {j["name"]: j for j in report["jobs"]}
    big = {d["index"] for d in report["devices"] if d["total_bytes"] == 80 * GIB}
    for i, size in enumerate(sizes):
        row = rows[f"j{i}"]
        assert row["claim_bytes"] >= size * GIB
        if size > 16:  # only the 80 GiB GPU holds it
            assert row["gpu"] in big and row["detail"].startswith("node")
    assert report["policy"] == policy and report["makespan_s"] > 0
    assert report["decisions"]["count"] >= 1 and set(scored) == {policy}
    assert_on_gpus_with_room(report)


def needs(need_gib: float, seconds: float = 0.2) -> list[str]:
    """A job that claims its budget and runs out of memory (torch's way: an OutOfMemoryError
    ends it) unless the budget is at least ``need_gib``."""
    code = (
        "import os, time, memgov\n"
        "budget = int(os.environ['MEMGOV_CLAIM'])\n"
        "c = memgov.claim(budget, device=os.environ['MEMGOV_DEVICE'])\n"
        "class OutOfMemoryError(RuntimeError): pass\n"
        f"if budget < {need_gib} * 2**30:\n"
        "    raise OutOfMemoryError(f'CUDA out of memory: {budget} bytes is not enough')\n"
        f"time.sleep({seconds})\n"
    )
    return [sys.executable, "-c", code]


def test_an_oom_under_a_learned_size_is_run_again_larger_and_counted(
    cluster: dict[str, Path], tmp_path: Path
) -> None:
    jobs: list[dict[str, Any]] = [
        {"name": "once", "cmd": needs(5), "claim": "auto", "env": {"MEMGOV_JOB": "ray-once"}},
        {"name": "always", "cmd": needs(500), "claim": "auto", "env": {"MEMGOV_JOB": "ray-all"}},
        {"name": "given", "cmd": needs(5), "claim": "2GiB", "env": {"MEMGOV_JOB": "ray-given"}},
        {"name": "fits", "cmd": needs(1), "claim": "2GiB"},
        {"name": "huge", "cmd": needs(1), "claim": "100GiB"},
        {"name": "missing", "cmd": [str(tmp_path / "no-such-program")], "claim": "1GiB"},
    ]
    report = watched(cluster, write_queue(tmp_path / "q.toml", jobs), "fifo")
    rows = {j["name"]: j for j in report["jobs"]}
    counted = {n: (r["end"], r["ooms"], r["retries"], r["attempts"]) for n, r in rows.items()}
    assert counted == {
        "once": ("ok", 1, 1, 2),  # 4 GiB (a quarter of the 16 GiB type: no profile), then 6
        "always": ("oom", 3, 2, 3),  # at most two re-tries
        "given": ("oom", 1, 0, 1),  # a size the user gave is never changed
        "fits": ("ok", 0, 0, 1),
        "huge": ("failed", 0, 0, 1),  # no GPU of the cluster holds it: never submitted
        "missing": ("failed", 0, 0, 1),
    }
    assert "cannot start" in rows["missing"]["detail"]
    assert "never started" in rows["huge"]["detail"] and "80.00 GiB" in rows["huge"]["detail"]
    assert (report["ooms"], report["retries"]) == (5, 3)
    once = _profiles.read("ray-once")  # the driver's store: the runs came back from the node
    assert once is not None
    claims = [r["claim"] for r in once.runs]
    assert once.runs[0]["end"] == "oom" and len(claims) == 2
    assert claims[1] >= 1.5 * claims[0] and claims[1] == rows["once"]["claim_bytes"]
    assert rows["once"]["claim_bytes"] >= 5 * GIB > claims[0]
    always = _profiles.read("ray-all")
    assert always is not None and [r["end"] for r in always.runs] == ["oom"] * 3
    grown = [r["claim"] for r in always.runs]
    assert grown[1] >= 1.5 * grown[0] and grown[2] >= 1.5 * grown[1]
    learned = _autosize.need(always, True)  # grown twice, then no more (OOM_GROWTHS)
    assert learned is not None and learned[0] == grown[2] and "not grown further" in learned[1]
    assert report["decisions"]["count"] >= 3  # the first, then one per round of re-tries
    assert_on_gpus_with_room(report)


def shape(value: Any) -> Any:
    """The kind of a report: its keys, recursively (lists by their first item), and which
    values are text; a figure may be null in one run and a number in another (a solo time)."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    return "text" if isinstance(value, str) else "figure"


def test_the_report_on_ray_has_the_local_reports_figures(
    cluster: dict[str, Path], tmp_path: Path
) -> None:
    jobs: list[dict[str, Any]] = [
        {"name": f"k{i}", "cmd": claimer(1.2), "claim": "3GiB", "kind": "k", "duration": 1}
        for i in range(3)
    ]
    path = write_queue(tmp_path / "q.toml", jobs)
    local = q.run(path, "fifo").to_json()  # the two simulated GPUs of tests/queue
    on_ray = watched(cluster, path, "fifo")
    for report in (local, on_ray):
        assert [j["end"] for j in report["jobs"]] == ["ok"] * 3
        assert all(j["peak_bytes"] for j in report["jobs"])  # the profile runs' peaks
        assert all(j["sharing"] is not None for j in report["jobs"])
        assert report["samples"] and report["samples"][0]["gpus"]
    for device in on_ray["devices"]:
        assert device.pop("node")  # the only addition on Ray: each GPU's node
    for report in (local, on_ray):
        assert set(report.pop("learned")) == {"alpha"}  # keyed by the kinds that met
    assert shape(on_ray) == shape(local)


def test_memgov_queue_run_ray_address_prints_the_report(
    cluster: dict[str, Path], tmp_path: Path
) -> None:
    jobs: list[dict[str, Any]] = [
        {"name": "a", "cmd": claimer(0.2), "claim": "2GiB"},
        {"name": "b", "cmd": needs(5), "claim": "auto", "env": {"MEMGOV_JOB": "ray-cli"}},
    ]
    path = write_queue(tmp_path / "q.toml", jobs)
    address = ray.get_runtime_context().gcs_address
    out = tmp_path / "report.json"
    ran = memgov_cli("queue", "run", "--ray", address, str(path), "--out", str(out), timeout=300)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "makespan" in ran.stdout and "1 OOM(s), 1 re-try" in ran.stdout
    report = json.loads(out.read_text())
    assert [(j["end"], j["retries"]) for j in report["jobs"]] == [("ok", 0), ("ok", 1)]
    assert_on_gpus_with_room(report)


def test_ctrl_c_stops_the_ray_run_and_its_commands(
    cluster: dict[str, Path], tmp_path: Path
) -> None:
    mark = tmp_path / "pid"
    code = f"import os, time; open({str(mark)!r}, 'w').write(str(os.getpid())); time.sleep(600)"
    path = write_queue(tmp_path / "q.toml", [{"name": "long", "cmd": [sys.executable, "-c", code]}])
    address = ray.get_runtime_context().gcs_address
    driver = subprocess.Popen(
        [sys.executable, "-m", "memgov", "queue", "run", "--ray", address, str(path), "--json"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        # a shell's background jobs ignore SIGINT; Ctrl-C on a terminal would reach it
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 120
        while not (mark.exists() and mark.read_text()) and time.monotonic() < deadline:
            time.sleep(0.2)
        job = int(mark.read_text())
        driver.send_signal(signal.SIGINT)
        out, _ = driver.communicate(timeout=120)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert driver.returncode == 130
    report = json.loads(out)
    assert report["interrupted"] == signal.SIGINT
    assert [(j["end"], j["state"]) for j in report["jobs"]] == [("stopped", "queued")]
    deadline = time.monotonic() + 60  # the cancelled task stops its command (SIGTERM)
    while _alive(job) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(job)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_run_that_came_back_is_added_to_the_drivers_profile_once() -> None:
    job = Job(1, "train", ["python3", "train.py"], "/", {}, job="ray-remember")
    run = {"peak": 3 * GIB, "end": "exit", "time": 1.0e9, "claim": 4 * GIB, "pid": 4242}
    remember(job, run)
    remember(job, dict(run))  # the driver shares the node's store: the run is there already
    remember(job, {**run, "pid": 4343, "end": "oom"})
    remember(job, None)  # a job that never claimed recorded no run
    profile = _profiles.read("ray-remember")
    assert profile is not None and [r["pid"] for r in profile.runs] == [4242, 4343]


def test_a_job_whose_worker_dies_is_lost_and_never_run_twice(
    cluster: dict[str, Path], tmp_path: Path
) -> None:
    starts = tmp_path / "starts"
    code = (
        "import os, time\n"
        f"with open({str(starts)!r}, 'a') as f: f.write(f'{{os.getppid()}} {{os.getpid()}}\\n')\n"
        "time.sleep(600)\n"
    )
    path = write_queue(tmp_path / "q.toml", [{"name": "w", "cmd": [sys.executable, "-c", code]}])
    killer = threading.Thread(target=_kill_worker_once_started, args=(starts,), daemon=True)
    killer.start()
    report = run_on_ray(path, "auto").to_json()
    killer.join(10)
    (row,) = report["jobs"]
    assert (row["end"], row["state"], row["attempts"]) == ("lost", "failed", 1), row
    (started,) = starts.read_text().splitlines()  # Ray did not run it a second time
    with contextlib.suppress(ProcessLookupError):  # the command outlives its worker, as a
        os.kill(int(started.split()[1]), signal.SIGKILL)  # local job outlives its shepherd


def _kill_worker_once_started(starts: Path) -> None:
    deadline = time.monotonic() + 120
    while not (starts.exists() and starts.read_text()) and time.monotonic() < deadline:
        time.sleep(0.2)
    os.kill(int(starts.read_text().split()[0]), signal.SIGKILL)  # the job's Ray worker


def test_the_samples_read_every_gpus_claims_on_its_node(cluster: dict[str, Path]) -> None:
    class Holder:  # holds 5 GiB on the 80 GiB GPU (the only one of its type) until killed
        def where(self) -> str:
            return str(memgov.ray.assigned_device().uuid)

    holder = memgov.ray.remote(budget="5GiB", gpu="80GiB")(Holder).remote()
    found = None
    try:
        uuid = ray.get(holder.where.remote())
        found = discover(cluster_types(ray.cluster_resources()))
        readings = found.read()
    finally:
        ray.kill(holder)
        for reader in found.readers if found else []:
            ray.kill(reader)
    assert readings is not None
    assert len(found.devices) == 4 and sorted(r["gpu"] for r in readings) == [0, 1, 2, 3]
    (held,) = [d.index for d in found.devices if d.uuid == uuid]
    for entry in readings:
        expected = 5 * GIB if entry["gpu"] == held else 0
        assert (entry["claimed_bytes"], entry["used_bytes"]) == (expected, expected), readings


@pytest.fixture(autouse=True)
def decisions_seen(monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver's engine decides through the decision core; a policy here with ``decided``
    sees each decision (its view, and the core's placements) as the engine makes it."""
    placing = engine_module.place

    def place(policy: Any, view: decide.View) -> list[tuple[int, int]]:
        hook = getattr(policy, "decided", None)
        return hook(view, placing) if hook else placing(policy, view)

    monkeypatch.setattr(engine_module, "place", place)


class Spread(Fifo):
    """fifo, but on the GPU with room that holds the fewest jobs, the highest index first (Ray's
    own count would pack a node's first GPU): records its placements, and the views it saw."""

    name = "spread"

    def __init__(self) -> None:
        self.chosen: dict[int, int] = {}
        self.views: list[decide.View] = []

    def rank(self, job: Any, gpus: Any, book: Any) -> Any:
        return np.array([g.index / 100 - len(book.kinds_on(g)) for g in gpus])

    def decided(self, view: decide.View, placing: Any) -> list[tuple[int, int]]:
        self.views.append(view)
        placed: list[tuple[int, int]] = placing(self, view)
        self.chosen.update(placed)
        return placed


def where_it_ran(out: Path, seconds: float) -> list[str]:
    """A job that claims its budget on MEMGOV_DEVICE as a framework's import would (waiting up
    to MEMGOV_WAIT), writes where it runs (its GPU and its node's ledger) and when its claim was
    admitted to ``out``, and holds the claim a while."""
    code = (
        "import json, os, time, memgov\n"
        "c = memgov.claim(int(os.environ['MEMGOV_CLAIM']), device=os.environ['MEMGOV_DEVICE'],\n"
        "                 wait=float(os.environ['MEMGOV_WAIT']))\n"
        "seen = {k: os.environ.get(k) for k in ('MEMGOV_DEVICE', 'MEMGOV_DIR')}\n"
        f"open({str(out)!r}, 'w').write(json.dumps({{**seen, 'admitted': time.time()}}))\n"
        f"time.sleep({seconds})\n"
    )
    return [sys.executable, "-c", code]


def node_of(uuid: str) -> str:
    (name,) = [n for n, spec in NODES.items() if f"{uuid}:" in spec]
    return name


def test_the_policy_chooses_the_gpu_and_the_job_runs_on_that_node_and_gpu(
    cluster: dict[str, Path], tmp_path: Path
) -> None:
    sizes = [6, 30, 6, 50, 12, 4, 14, 3]
    jobs: list[dict[str, Any]] = [
        {"name": f"p{i}", "cmd": where_it_ran(tmp_path / f"p{i}.json", 0.5), "claim": f"{s}GiB"}
        for i, s in enumerate(sizes)
    ]
    policy = Spread()
    watch = Watch(cluster)
    watch.start()
    try:
        report = run_on_ray(write_queue(tmp_path / "q.toml", jobs), "auto", policy=policy)
    finally:
        watch.done.set()
        watch.join(10)
    assert watch.over == []  # no ledger ever held more than its GPU
    rows = report.to_json()["jobs"]
    assert [r["end"] for r in rows] == ["ok"] * len(sizes), rows
    devices = {d["index"]: d for d in report.to_json()["devices"]}
    first = policy.views[0]  # the cluster's four GPUs, as the policy saw them: all free
    assert sorted((g.capacity, g.free) for g in first.gpus) == sorted(
        [(16 * GIB, 16 * GIB)] * 3 + [(80 * GIB, 80 * GIB)]
    )
    for i, row in enumerate(rows):
        gpu = policy.chosen[i + 1]  # job ids number the file's jobs from 1
        assert row["gpu"] == gpu, (row, policy.chosen)  # the report: where the policy put it
        seen = json.loads((tmp_path / f"p{i}.json").read_text())
        uuid = seen["MEMGOV_DEVICE"]
        assert devices[gpu]["uuid"] == uuid  # the command claimed on the chosen GPU
        assert seen["MEMGOV_DIR"] == str(cluster[node_of(uuid)])  # on that GPU's node
        if sizes[i] > 16:
            assert devices[gpu]["total_bytes"] == 80 * GIB
    assert set(policy.chosen.values()) == set(devices)  # both GPUs of n2x16 among them
    assert_on_gpus_with_room(report.to_json())


class OnTheBigGpu(Spread):
    """Places on the 80 GiB GPU only; at its first placement a claim from outside the queue
    takes most of that GPU (after the view was read, before the task runs: the race a
    sample cannot see), and holds it a few seconds."""

    name = "on-the-big-gpu"

    def __init__(self, holder: list[str], env: dict[str, str]) -> None:
        super().__init__()
        self.holder, self.env = holder, env
        self.proc: subprocess.Popen[str] | None = None

    def decided(self, view: decide.View, placing: Any) -> list[tuple[int, int]]:
        big = [g for g in view.gpus if g.capacity == 80 * GIB]
        narrowed = decide.View(view.now, view.jobs, big, view.cores, view.learned, view.gates)
        placed = super().decided(narrowed, placing)
        if placed and self.proc is None:
            env = {**os.environ, **self.env, "PYTHONPATH": str(ROOT)}
            self.proc = subprocess.Popen(self.holder, env=env, stdout=subprocess.PIPE, text=True)
            assert self.proc.stdout is not None and self.proc.stdout.readline() == "held\n"
        return placed


def test_a_pinned_gpu_taken_from_outside_meanwhile_makes_the_claim_wait(
    cluster: dict[str, Path], tmp_path: Path
) -> None:
    released = tmp_path / "released"
    holder = [
        sys.executable,
        "-c",
        "import time, memgov\n"
        f"c = memgov.claim({75 * GIB}, device='n80g0')\n"
        "print('held', flush=True)\n"
        "time.sleep(3)\n"
        f"c.release(); open({str(released)!r}, 'w').write(str(time.time()))\n",
    ]
    env = {"MEMGOV_DEVICES": NODES["n80"], "MEMGOV_DIR": str(cluster["n80"])}
    policy = OnTheBigGpu(holder, env)
    out = tmp_path / "job.json"
    job = {"name": "late", "cmd": where_it_ran(out, 0.2), "claim": "12GiB"}
    watch = Watch(cluster)
    watch.start()
    try:
        report = run_on_ray(write_queue(tmp_path / "q.toml", [job]), "auto", policy=policy)
    finally:
        watch.done.set()
        watch.join(10)
        if policy.proc is not None:
            policy.proc.wait(30)
    assert watch.over == []  # the ledger never admitted both
    (row,) = report.to_json()["jobs"]
    assert (row["end"], row["attempts"], row["gpu"]) == ("ok", 1, policy.chosen[1]), row["detail"]
    seen = json.loads(out.read_text())
    assert seen["MEMGOV_DEVICE"] == "n80g0"
    assert seen["admitted"] >= float(released.read_text())  # it waited for the holder


def test_a_due_job_waiting_for_room_is_not_polled_for() -> None:
    # The driver sleeps until a task ends, a sample or an arrival still ahead: a job already due
    # that waits for room must not make it wake every 10 ms.
    from types import SimpleNamespace

    from memgov.queue.onray import RayQueue

    now = time.time()
    due = SimpleNamespace(state="queued", not_before=now - 5)
    ahead = SimpleNamespace(state="queued", not_before=now + 30)
    assert RayQueue._next_arrival(SimpleNamespace(jobs=[due])) == float("inf")  # type: ignore[arg-type]
    assert RayQueue._next_arrival(SimpleNamespace(jobs=[due, ahead])) == ahead.not_before  # type: ignore[arg-type]
