"""Several MPS control daemons per GPU: start, status, stop, and which daemon a hard claim joins.

No NVIDIA driver here, so ``nvidia-cuda-mps-control`` is a stand-in (tests/helpers/
fake_mps_control.py): real background processes with real UNIX-socket endpoints, PID files and
process names, answering the three commands memgov sends. What it cannot show (that a real
server admits 48 clients, and that a second daemon admits 48 more) is measured on the GPU
machine by benchmarks/gpu/mps_density.sh. Admission runs on a simulated device with the mode
claim() would pass on a real GPU ("hard"), with real records and flocks.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

import memgov
from memgov._gpu import enforce as _enforce, mps as _mps, mpsctl as _mpsctl
from memgov._gpu.devices import Device, candidates
from memgov._ledger import admission as _admission
from memgov._ledger.ledger import DeviceLedger
from memgov._ledger.records import Held
from tests.helpers import fake_mps_control, hard_holder

GPU = Device(0, "GPU-00000000-1111-2222-3333-444444444444", "real GPU", 80 * 2**30, 0, False, 0)
GIB = 2**30


@pytest.fixture
def fake_mps(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The stand-in control program first on PATH, and a short ledger path (socket paths are
    limited to 107 bytes). Every daemon still running at the end is stopped."""
    base = Path(tempfile.mkdtemp(prefix="mg-", dir="/tmp"))
    program = fake_mps_control.install(base / "bin")
    monkeypatch.setenv("PATH", f"{program.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("MEMGOV_DIR", str(base / "ledger"))
    for name in (
        "CUDA_MPS_PIPE_DIRECTORY",
        "MEMGOV_MPS_CLIENTS",
        "MEMGOV_MPS_POLICY",
        "MEMGOV_MPS",
        "MEMGOV_CONTEXTS",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
    ):
        monkeypatch.delenv(name, raising=False)
    yield base / "ledger"
    for k in _mps.running_daemons():
        pid = _mps.daemon_pid(_mps.paths(k).pipe)
        if pid:
            os.kill(pid, signal.SIGKILL)
    shutil.rmtree(base, ignore_errors=True)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "memgov.cli", "mps", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_start_runs_as_many_daemons_as_asked_each_with_its_folders(fake_mps: Path) -> None:
    result = cli("start", "--daemons", "3", "--json")
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["running_daemons"] == 3 and info["started"] == [0, 1, 2]
    assert sorted(info["start_s"]) == ["0", "1", "2"]  # JSON keys
    pipes = [d["pipe"] for d in info["daemons"]]
    assert pipes == [str(fake_mps / "mps" / p) for p in ("pipe", "pipe-1", "pipe-2")]
    pids = {d["daemon_pid"] for d in info["daemons"]}
    assert len(pids) == 3 and all(d["started_by_memgov"] for d in info["daemons"])
    assert _mps.running_daemons() == [0, 1, 2]
    # Asking again for what already runs is an error that says so; asking for more starts more.
    again = cli("start", "--daemons", "3")
    assert again.returncode == 2 and "3 MPS control daemon(s) already run" in again.stderr
    more = cli("start", "--daemons", "4", "--json")
    assert more.returncode == 0, more.stderr
    assert json.loads(more.stdout)["started"] == [3]
    text = cli("status")
    assert "MPS daemon 3: running" in text.stdout and "48 client" not in text.stderr
    stopped = cli("stop", "--json")
    assert stopped.returncode == 0, stopped.stderr
    report = json.loads(stopped.stdout)
    assert report["stopped"] and report["daemons"] == [0, 1, 2, 3]
    assert _mps.running_daemons() == []
    assert not any((fake_mps / "mps").glob("state*.json"))  # nothing recorded is left behind
    for pid in pids:
        assert gone_or_zombie(pid)


def gone_or_zombie(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE  # orphans wait for init
    except psutil.NoSuchProcess:
        return True


def test_stop_checks_every_daemon_before_stopping_any(fake_mps: Path) -> None:
    _mps.start(daemons=2)
    (_mps.paths(1).pipe / "fake-clients").write_text(f"{os.getpid()}\n")
    with pytest.raises(_mps.MpsError, match="1 client process"):
        _mps.stop()
    assert _mps.running_daemons() == [0, 1]  # daemon 0 was not stopped either
    report = _mps.stop(force=True)
    assert report["stopped"] and report["clients_at_stop"] == [os.getpid()]
    assert any(a.startswith("daemon 1: ") for a in report["actions"])


def test_the_context_manager_stops_only_what_it_started(fake_mps: Path) -> None:
    _mps.start(daemons=1)
    with _mps.daemon(daemons=3) as info:
        assert info["started_here"] and info["started"] == [1, 2]
        assert _mps.running_daemons() == [0, 1, 2]
    assert _mps.running_daemons() == [0]  # daemon 0 was there before: not ours to stop
    _mps.stop()


def test_a_claim_may_join_any_running_daemon(
    fake_mps: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _mps.start(daemons=3)
    plan = _enforce.decide([GPU], cuda_initialized=False)
    assert plan.hard and plan.memgov_daemon and plan.daemons == (0, 1, 2)
    assert "3 of memgov's daemons" in plan.reason
    # Inherited from pack or a parent's claim, memgov's own pipe folder still lets it choose.
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(_mps.paths(1).pipe))
    assert _enforce.decide([GPU], cuda_initialized=False).daemons == (0, 1, 2)
    # Someone else's folder is the only place CUDA would look: one server, as before.
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(fake_mps.parent / "elsewhere"))
    assert not _enforce.decide([GPU], cuda_initialized=False).hard
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY")
    # The daemon admission picked is where CUDA is pointed.
    previous = _enforce.apply(plan, GIB, 0, None, daemon=2)
    assert os.environ["CUDA_MPS_PIPE_DIRECTORY"] == str(_mps.paths(2).pipe)
    assert os.environ["CUDA_MPS_LOG_DIRECTORY"] == str(_mps.paths(2).log)
    _enforce.restore(previous)
    assert "CUDA_MPS_PIPE_DIRECTORY" not in os.environ
    _mps.stop()


# -- which daemon: the ledger's count per daemon ------------------------------------------------
def admit(
    daemons: tuple[int, ...], wait: float | None = None
) -> tuple[DeviceLedger, Held, int | None]:
    (device,) = candidates(None)
    admitted = _admission.admit(
        [DeviceLedger(device)],
        _admission.Request(
            {device.uuid: GIB}, "job", wait, {device.uuid: ("hard", "test")}, daemons=daemons
        ),
    )
    return admitted.ledger, admitted.held, admitted.mps_daemon


@pytest.mark.parametrize(
    ("policy", "order"),
    [
        ("", [0, 0, 1, 1, 2, 2]),  # default: fill the lowest-numbered daemon first
        ("fill", [0, 0, 1, 1, 2, 2]),
        ("spread", [0, 1, 2, 0, 1, 2]),
    ],
)
def test_hard_claims_fill_or_spread_over_the_daemons(
    sim: str, monkeypatch: pytest.MonkeyPatch, policy: str, order: list[int]
) -> None:
    monkeypatch.setenv("MEMGOV_MPS_CLIENTS", "2")
    monkeypatch.setenv("MEMGOV_MPS_POLICY", policy)
    held = [admit((0, 1, 2)) for _ in range(6)]
    assert [k for _, _, k in held] == order
    assert held[0][0].snapshot().hard_by_daemon == {0: 2, 1: 2, 2: 2}
    with pytest.raises(memgov.BudgetExceeded) as refused:
        admit((0, 1, 2))  # the 7th: every daemon is full
    assert (
        "MPS client limit 2 reached on sim0 on every running daemon (daemon 0: 2, "
        "daemon 1: 2, daemon 2: 2 hard-mode claims)" in str(refused.value)
    )
    assert "memgov mps start --daemons N" in str(refused.value)
    ledger, record, k = held.pop(3)  # a client of daemon 1 (fill) or 0 (spread) ends
    ledger.remove("claims", record)
    assert admit((0, 1, 2))[2] == k  # its slot is the one with room again
    for ledger, record, _ in held:
        ledger.remove("claims", record)


def test_the_49th_client_joins_the_second_daemon(sim: str) -> None:
    held = [admit((0, 1)) for _ in range(49)]
    assert [k for _, _, k in held].count(0) == 48 and held[-1][2] == 1
    for ledger, record, _ in held:
        ledger.remove("claims", record)


def test_bad_policy_is_refused_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMGOV_MPS_POLICY", "random")
    with pytest.raises(memgov.MemgovError, match=r"MEMGOV_MPS_POLICY='random': accepted fill"):
        _mps.policy()


def test_a_killed_client_frees_its_slot_on_its_daemon(
    sim: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEMGOV_MPS_CLIENTS", "1")
    first = admit((0, 1))
    child = hard_holder.start(daemons=(0, 1))
    try:
        with pytest.raises(memgov.BudgetExceeded, match="every running daemon"):
            admit((0, 1))
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        assert admit((0, 1))[2] == 1  # the dead holder's flock is gone, and its slot on daemon 1
    finally:
        child.kill()
        child.wait()
    first[0].remove("claims", first[1])


# -- CUDA contexts without MPS ----------------------------------------------------------------
def test_claims_without_mps_stop_at_the_context_limit(
    sim: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEMGOV_CONTEXTS", "2")
    (device,) = candidates(None)
    ledger = DeviceLedger(device)

    def one(mode: str) -> Held:
        modes = {device.uuid: (mode, "")}
        return _admission.admit(
            [ledger], _admission.Request({device.uuid: GIB}, "j", modes=modes)
        ).held

    held = [one("soft"), one("soft"), one("hard")]  # MPS clients hold no context of their own
    with pytest.raises(memgov.BudgetExceeded) as refused:
        one("soft")
    assert "CUDA context limit 2 reached on sim0 (2 claims without MPS" in str(refused.value)
    assert "MEMGOV_CONTEXTS sets the limit" in str(refused.value)
    for record in held:
        ledger.remove("claims", record)


def test_context_limit_defaults_apply_to_real_gpus_only(monkeypatch: pytest.MonkeyPatch) -> None:
    from memgov._base import config as _config

    monkeypatch.delenv("MEMGOV_CONTEXTS", raising=False)
    assert _config.context_limit(simulated=False) == 72
    assert _config.context_limit(simulated=True) is None
    monkeypatch.setenv("MEMGOV_CONTEXTS", "off")
    assert _config.context_limit(simulated=False) is None
    for bad in ("0", "many", "-3"):
        monkeypatch.setenv("MEMGOV_CONTEXTS", bad)
        with pytest.raises(memgov.MemgovError, match=r"MEMGOV_CONTEXTS=.*accepted a whole number"):
            _config.context_limit(simulated=False)


def test_doctor_shows_the_limits_and_reports_a_bad_one(fake_mps: Path) -> None:
    _mps.start(daemons=2)
    try:

        def doctor(**env: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "-m", "memgov.cli", "doctor", *env.pop("a", "").split()],
                capture_output=True,
                text=True,
                timeout=60,
                env={**os.environ, **env},
            )

        info = json.loads(doctor(a="--json").stdout)["mps"]
        assert info["clients_per_daemon"] == 48 and info["memgov_daemons"] == [0, 1]
        assert info["policy"] == "fill" and info["contexts_per_gpu"] == 72
        text = doctor(MEMGOV_MPS_CLIENTS="60", MEMGOV_CONTEXTS="off").stdout
        assert "MPS: 60 clients per daemon per GPU" in text and "2 memgov daemon(s)" in text
        assert "without MPS at most unlimited claims" in text
        bad = doctor(MEMGOV_CONTEXTS="lots")
        assert bad.returncode == 0 and "MPS settings: MEMGOV_CONTEXTS='lots'" in bad.stdout
    finally:
        _mps.stop()


def test_claim_points_cuda_at_the_daemon_with_room(
    fake_mps: Path, sim: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The whole claim() path with memgov's real decision (three stand-in daemons answer), made
    # for a real GPU's description; only the simulated device's "no driver, so soft" is lifted.
    _mps.start(daemons=3)
    monkeypatch.setenv("MEMGOV_MPS_CLIENTS", "1")
    real_decide = _enforce.decide
    monkeypatch.setattr(_enforce, "decide", lambda _devices, init: real_decide([GPU], init))
    monkeypatch.setattr(
        _enforce.Plan, "mode", lambda self, device, compute=None: ("hard", self.reason)
    )
    held = [admit((0, 1, 2)), admit((0, 1, 2))]  # daemons 0 and 1 are full
    try:
        claim = memgov.claim("1GiB", name="third")
        assert claim.mode == "hard"
        assert os.environ["CUDA_MPS_PIPE_DIRECTORY"] == str(_mps.paths(2).pipe)
        assert os.environ["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=1024M"
        (third,) = [
            c for c in DeviceLedger(candidates(None)[0]).snapshot().claims if c.name == "third"
        ]
        assert third.extra["mps_daemon"] == 2
        with pytest.raises(memgov.BudgetExceeded, match="every running daemon"):
            _admission.admit(
                [DeviceLedger(candidates(None)[0])],
                _admission.Request(
                    {"sim0": GIB}, "fourth", modes={"sim0": ("hard", "test")}, daemons=(0, 1, 2)
                ),
            )
        claim.release()
        assert "CUDA_MPS_PIPE_DIRECTORY" not in os.environ
    finally:
        for ledger, record, _ in held:
            ledger.remove("claims", record)
        _mps.stop(force=True)


def _count_queries(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    asked: list[str] = []
    real = _mpsctl.query

    def counting(command: str, pipe: Path, timeout: float = _mpsctl.QUERY_TIMEOUT_S) -> str | None:
        asked.append(command)
        return real(command, pipe, timeout)

    monkeypatch.setattr(_mpsctl, "query", counting)
    return asked


def test_a_claim_does_not_queue_on_the_daemon_when_every_mps_process_is_its_users(
    fake_mps: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """25 claims starting together each asking the control daemon for its servers waited for
    one another; with nothing of another user's to find, none is asked."""
    _mps.start()
    asked = _count_queries(monkeypatch)
    pipe = _mps.paths(0).pipe
    assert _mpsctl.servers_all_ours([pipe])
    assert _enforce._server_uids([pipe]) == [{}]
    assert asked == []


def test_another_users_mps_process_makes_the_claim_ask_the_daemon(
    fake_mps: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to run a process as another user")
    _mps.start()
    pipe = _mps.paths(0).pipe
    # Started as root (the venv's interpreter may be out of another user's reach), then it
    # becomes user 65534 and takes a server's name.
    code = (
        "import ctypes, os, time; os.setgid(65534); os.setuid(65534); "
        "ctypes.CDLL(None).prctl(15, b'nvidia-cuda-mps-server', 0, 0, 0); "
        "print('up', flush=True); time.sleep(60)"
    )
    server = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "up"
        asked = _count_queries(monkeypatch)
        assert not _mpsctl.servers_all_ours([pipe])
        _enforce._server_uids([pipe])
        assert asked == ["get_server_list"]
    finally:
        server.kill()
        server.wait()


def test_a_process_of_another_user_under_the_daemon_makes_the_claim_ask(
    fake_mps: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real daemon's servers are its children and run as their clients' user: one of another
    user under the daemon counts whatever its name."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run a process as another user")
    _mps.start()
    pipe = _mps.paths(0).pipe
    child = int(_mpsctl.query("spawn_child 65534", pipe) or "0")
    try:
        assert child
        deadline = time.monotonic() + 30
        while psutil.Process(child).uids().real != 65534:  # it switches user once started
            assert time.monotonic() < deadline
            time.sleep(0.05)
        asked = _count_queries(monkeypatch)
        assert not _mpsctl.servers_all_ours([pipe])
        _enforce._server_uids([pipe])
        assert asked == ["get_server_list"]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)


def test_a_pid_file_naming_another_daemon_is_not_trusted(
    fake_mps: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A PID file naming a live MPS-named process that serves another pipe folder (a stale file
    whose PID was reused) makes the claim ask."""
    _mps.start(daemons=2)
    first, second = _mps.paths(0).pipe, _mps.paths(1).pipe
    assert _mpsctl.servers_all_ours([first, second])
    pid_file = first / "nvidia-cuda-mps-control.pid"
    real_pid = pid_file.read_text()
    pid_file.write_text((second / "nvidia-cuda-mps-control.pid").read_text())
    try:
        assert not _mpsctl.servers_all_ours([first])
    finally:
        pid_file.write_text(real_pid)


def test_a_daemon_whose_process_cannot_be_seen_is_asked(
    fake_mps: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A daemon in another PID namespace (its PID file names no live daemon here)."""
    _mps.start()
    pipe = _mps.paths(0).pipe
    pid_file = pipe / "nvidia-cuda-mps-control.pid"
    real_pid = pid_file.read_text()
    pid_file.write_text("999999999\n")
    try:
        asked = _count_queries(monkeypatch)
        assert not _mpsctl.servers_all_ours([pipe])
        _enforce._server_uids([pipe])
        assert asked == ["get_server_list"]
    finally:
        pid_file.write_text(real_pid)


def test_a_live_daemon_is_seen_from_proc_without_asking_it(
    fake_mps: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The PID file names a live MPS-named process: reachable without a query (the exporter asks
    at every refresh). A PID file naming a process of another name, or a zombie with the
    daemon's name, is not trusted: the daemon is asked."""
    _mps.start()
    pipe = _mps.paths(0).pipe
    pid_file = pipe / "nvidia-cuda-mps-control.pid"
    real_pid = pid_file.read_text()
    asked = _count_queries(monkeypatch)
    assert _mpsctl.reachable(pipe)
    assert asked == []
    zombie = os.fork()
    if zombie == 0:  # renamed as a daemon, then dead and not reaped until the end
        import ctypes

        ctypes.CDLL(None).prctl(15, b"nvidia-cuda-mps-control", 0, 0, 0)
        os._exit(0)
    try:
        for other in (os.getpid(), zombie):
            pid_file.write_text(f"{other}\n")
            while other == zombie and psutil.Process(zombie).status() != psutil.STATUS_ZOMBIE:
                time.sleep(0.01)
            asked.clear()
            assert _mpsctl.reachable(pipe)  # the real daemon answers the query
            assert asked == ["get_server_list"]
    finally:
        pid_file.write_text(real_pid)
        os.waitpid(zombie, 0)


@pytest.mark.parametrize(
    ("options", "hidden"),
    [
        ("rw", False),
        ("rw,hidepid=0", False),
        ("rw,hidepid=2", True),
        ("rw,hidepid=invisible", True),
        ("rw,hidepid=off", False),
    ],
)
def test_hidepid_is_read_from_the_proc_mount(options: str, hidden: bool) -> None:
    text = (
        "22 1 0:5 / / rw,relatime - ext4 /dev/sda1 rw\n"
        f"25 22 0:23 / /proc rw,nosuid,nodev,noexec - proc proc {options}\n"
    )
    assert _mpsctl.hidepid(text) is hidden


def test_a_procfs_mounted_again_over_proc_with_hidepid_counts() -> None:
    text = (
        "25 22 0:23 / /proc rw,nosuid - proc proc rw\n"
        "40 25 0:41 / /proc rw,relatime - proc proc rw,hidepid=invisible\n"
    )
    assert _mpsctl.hidepid(text)


CONTROL = "nvidia-cuda-mps-control"


def test_the_process_table_reads_names_with_parentheses_and_cut_names_whole() -> None:
    """servers_all_ours reads /proc itself (no psutil on the claim path): a name with ") " in it
    keeps its parent, and a name the kernel cut at 15 characters is completed from the command
    line only when its first word starts with it (psutil's rule)."""
    code = (
        "import ctypes, sys, time; ctypes.CDLL(None).prctl(15, sys.argv[1].encode(), 0, 0, 0); "
        "print('up', flush=True); time.sleep(60)"
    )
    odd = subprocess.Popen([sys.executable, "-c", code, "a) b (c"], stdout=subprocess.PIPE)
    cut = subprocess.Popen(
        ["bash", "-c", 'exec -a "$2" "$0" -c "$1" "$2"', sys.executable, code, CONTROL],
        stdout=subprocess.PIPE,
    )
    named = subprocess.Popen(
        [sys.executable, "-c", code, "nvidia-cuda-mps-server"], stdout=subprocess.PIPE
    )
    try:
        for proc in (odd, cut, named):
            assert proc.stdout is not None and proc.stdout.readline().strip() == b"up"
        table = _mpsctl._process_table()
        assert table[odd.pid] == ("a) b (c", os.getpid())
        assert table[os.getpid()][1] == os.getppid()
        assert table[cut.pid][0] == "nvidia-cuda-mps"
        assert _mpsctl._full_name(cut.pid, table[cut.pid][0]) == CONTROL
        # Renamed by prctl, but its command line starts with python: the cut name stays.
        assert _mpsctl._full_name(named.pid, table[named.pid][0]) == "nvidia-cuda-mps"
        assert _mpsctl._real_uid(odd.pid) == os.getuid()
    finally:
        for proc in (odd, cut, named):
            proc.kill()
            proc.wait()
