"""`memgov exporter`: real holders come and go, a real HTTP server answers, garbage never breaks
a scrape, the counters count, the textfile is written whole and never through a link."""

from __future__ import annotations

import fcntl
import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from memgov._ledger.ledger import new_record_name
from memgov.exporter.holders import parse_cgroup
from tests.helpers.procs import Child, ledger, wait_until

from .conftest import Exporter, FakeNvml, Scrape, parse, stop_exporter

GIB = 2**30
ROOT = Path(__file__).resolve().parents[2]


def claims(scrape: Scrape, metric: str = "memgov_claim_budget_bytes") -> dict[str, float]:
    """Claim name -> value of a per-claim metric."""
    return {labels["name"]: value for labels, value in scrape.get(metric, [])}


def hold(children: list[Child], size: str, name: str, *extra: str) -> Child:
    child = Child([size, "--name", name, *extra])
    children.append(child)
    child.expect("admitted")
    return child


def test_each_claim_is_shown_and_a_killed_holder_disappears(
    sim: str, exporter: Callable[..., Exporter], children: list[Child]
) -> None:
    a = hold(children, "4GiB", "trainer-a")
    hold(children, "2GiB", "trainer-b")
    server = exporter()
    scrape = server.scrape()
    assert claims(scrape) == {"trainer-a": 4 * GIB, "trainer-b": 2 * GIB}
    labels = next(lb for lb, _ in scrape["memgov_claim_budget_bytes"] if lb["name"] == "trainer-a")
    assert labels["gpu"] == "0" and labels["UUID"] == "sim0" and labels["mode"] == "soft"
    assert labels["pid"] == str(a.proc.pid) and labels["user"]
    gpu = {
        name: scrape[name][0][1]
        for name in (
            "memgov_gpu_memory_total_bytes",
            "memgov_gpu_claimed_bytes",
            "memgov_gpu_free_budget_bytes",
        )
    }
    assert gpu == {
        "memgov_gpu_memory_total_bytes": 64 * GIB,
        "memgov_gpu_claimed_bytes": 6 * GIB,
        "memgov_gpu_free_budget_bytes": 58 * GIB,
    }
    a.kill()
    a.proc.wait(timeout=10)
    killed = time.time()
    # The first body refreshed after the death (the death itself starts that refresh): the
    # flock died with the process, no clean-up ran in between.
    scrape = server.scrape_after(killed)
    assert claims(scrape) == {"trainer-b": 2 * GIB}
    assert scrape["memgov_gpu_claimed_bytes"][0][1] == 2 * GIB
    hold(children, "1GiB", "trainer-c")
    admitted = time.time()
    assert claims(server.scrape_after(admitted)) == {"trainer-b": 2 * GIB, "trainer-c": GIB}


def test_a_death_or_a_new_claim_refreshes_at_once(
    sim: str, exporter: Callable[..., Exporter], children: list[Child]
) -> None:
    """With a refresh interval far beyond this test's waits, only the change triggers can make
    the body follow: a watched holder's death (pidfd) and a new record (the folder's times)."""
    a = hold(children, "4GiB", "trainer-a")
    hold(children, "2GiB", "trainer-b")
    server = exporter(args=("--refresh", "600"))
    assert claims(server.scrape()) == {"trainer-a": 4 * GIB, "trainer-b": 2 * GIB}
    a.kill()
    a.proc.wait(timeout=10)
    wait_until(lambda: "trainer-a" not in claims(server.scrape()), timeout=30)
    hold(children, "1GiB", "trainer-c")
    wait_until(lambda: "trainer-c" in claims(server.scrape()), timeout=30)
    assert claims(server.scrape()) == {"trainer-b": 2 * GIB, "trainer-c": GIB}
    refreshes = {lb["reason"]: v for lb, v in server.scrape()["memgov_exporter_refreshes_total"]}
    assert refreshes["start"] == 1 and refreshes["interval"] == 0 and refreshes["change"] >= 2


def test_a_scrape_only_sends_the_prepared_body(
    sim: str, exporter: Callable[..., Exporter], children: list[Child]
) -> None:
    """Between refreshes every scrape gets the same bytes: nothing is read or rendered for it."""
    hold(children, "1GiB", "trainer-a")
    server = exporter()
    first = server.text()
    stamp = parse(first)["memgov_exporter_last_refresh_timestamp_seconds"][0][1]
    same = [server.text() for _ in range(20)]
    fresh = [t for t in same if t != first]
    # Only a refresh (every 5 s by default) may change it, and then its timestamp moves on.
    assert all(
        parse(t)["memgov_exporter_last_refresh_timestamp_seconds"][0][1] > stamp for t in fresh
    )
    assert len(fresh) < len(same)


def test_use_comes_from_nvml_by_host_pid(
    fake_nvml: FakeNvml, exporter: Callable[..., Exporter], children: list[Child]
) -> None:
    a = hold(children, "4GiB", "trainer-a")
    b = hold(children, "2GiB", "trainer-b")
    fake_nvml.set({a.proc.pid: 3 * GIB, b.proc.pid: GIB // 2, os.getpid(): GIB})
    scrape = exporter().scrape()
    assert claims(scrape, "memgov_claim_used_bytes") == {
        "trainer-a": 3 * GIB,
        "trainer-b": GIB // 2,
    }
    gpu = scrape["memgov_gpu_memory_used_bytes"][0]
    assert gpu[0]["modelName"] == "NVIDIA Fake80" and gpu[1] == 4.5 * GIB
    assert scrape["memgov_gpu_outside_bytes"][0][1] == GIB  # this test process holds no claim


def _plant_live(folder: Path, payload: object) -> int:
    """A record file whose lock this test process holds: the ledger counts it as live."""
    folder.mkdir(parents=True, exist_ok=True)
    name = new_record_name()
    path = folder / name
    path.write_text(payload if isinstance(payload, str) else json.dumps(payload))
    fd = os.open(path, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def _record(name: str, device: str = "sim0", **extra: object) -> dict[str, object]:
    return {
        "version": 1,
        "id": "planted",
        "kind": "claim",
        "device": device,
        "bytes": GIB,
        "name": name,
        "pid": 1,
        "created": time.time(),
        **extra,
    }


def test_planted_files_cannot_break_a_scrape(
    sim: str, exporter: Callable[..., Exporter], children: list[Child]
) -> None:
    hold(children, "2GiB", "honest")
    folder = ledger().path / "claims"
    evil = 'q"uote\\back\nline\x1b[31m \udcff ' + "x" * 4000
    fds = [
        _plant_live(folder, _record(evil, host='h"\n\\')),
        _plant_live(folder, _record("other", device="GPU-elsewhere")),
        _plant_live(folder, json.dumps(_record("surrogate \ud800 name"))),
        _plant_live(folder, "\xff\xfe not json"),
        _plant_live(folder, _record("deep", extra=[[[[[[[[[[1]]]]]]]]]])),
        _plant_live(folder, _record("huge-pid", pid=2**70)),
    ]
    (folder / new_record_name()).write_bytes(b"{" * 70_000)
    (folder / new_record_name()).symlink_to("/etc/passwd")
    os.mkfifo(folder / new_record_name())
    (folder / new_record_name()).mkdir()
    stats = ledger().path / "stats"
    stats.mkdir(exist_ok=True)
    (stats / "u0.json").write_text('{"version": 1, "reclaimed": 99999999999999999999999}')
    (stats / "u4242.json").write_text(json.dumps({"version": 1}))  # owned by root, not 4242
    (stats / "u7.json").symlink_to("/etc/shadow")
    try:
        server = exporter()
        text = server.text()
        scrape = parse(text)  # prometheus_client's own parser accepts every line
    finally:
        for fd in fds:
            os.close(fd)
    names = claims(scrape)
    assert names["honest"] == 2 * GIB
    shown = [n for n in names if n.startswith('q"uote')]
    assert len(shown) == 1 and "\n" not in shown[0] and "\x1b" not in shown[0]
    assert len(shown[0]) == 256 and "\\n" in shown[0]  # escaped as text, bounded
    assert any(n.startswith("surrogate") for n in names)
    assert "other" not in names and "huge-pid" not in names and "deep" not in names
    assert scrape["memgov_ledger_problem_files"][0][1] >= 7
    assert scrape["memgov_ledger_readable"][0][1] == 1
    assert "memgov_ledger_reclaimed_records_total" not in scrape  # every stats file skipped
    assert server.proc.poll() is None


def test_counters_count_refusals_waits_and_reclaims(
    sim: str,
    exporter: Callable[..., Exporter],
    children: list[Child],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MEMGOV_DEVICES", "sim0:8GiB")
    big = hold(children, "6GiB", "big")
    refused = Child(["4GiB", "--name", "refused"])
    children.append(refused)
    refused.expect("refused")
    timed_out = Child(["4GiB", "--name", "late", "--wait", "0.3"])
    children.append(timed_out)
    timed_out.expect("refused")
    big.kill()
    big.proc.wait(timeout=10)
    hold(children, "4GiB", "after")  # its admission reclaims the dead holder's record
    scrape = exporter().scrape()
    by_reason = {lb["reason"]: v for lb, v in scrape["memgov_admission_refusals_total"]}
    assert by_reason["no_room"] == 1 and by_reason["timeout"] == 1
    assert sum(by_reason.values()) == 2
    assert scrape["memgov_ledger_reclaimed_records_total"][0][1] == 1
    counts = {lb["outcome"]: v for lb, v in scrape["memgov_admission_wait_seconds_count"]}
    assert counts == {"admitted": 0, "timeout": 1}
    waited = {lb["outcome"]: v for lb, v in scrape["memgov_admission_wait_seconds_sum"]}
    assert waited["timeout"] >= 0.3
    waiter = Child(["5GiB", "--name", "queued", "--wait", "60"])  # 4 GiB free: it must queue
    children.append(waiter)
    wait_until(lambda: len(ledger().snapshot().queue) == 1, timeout=120)
    children[-2].release()  # "after" leaves; the waiter gets in
    waiter.expect("admitted")
    scrape = exporter().scrape()
    counts = {lb["outcome"]: v for lb, v in scrape["memgov_admission_wait_seconds_count"]}
    assert counts == {"admitted": 1, "timeout": 1}


LOCK_HOLDER = (
    "import time\nfrom memgov._gpu.devices import devices\n"
    "from memgov._ledger.ledger import DeviceLedger\n"
    "lock = DeviceLedger(devices()[0]).locked(1).__enter__()\nprint('held', flush=True)\n"
    "time.sleep(300)\n"
)
CLAIM_WITH_SHORT_LOCK_BOUND = (
    "import sys\nfrom memgov._base import config as _config\n"
    "_config.LOCK_TIMEOUT_S = 0.5\nimport memgov\n"
    "wait = float(sys.argv[1]) if sys.argv[1] != '-' else None\n"
    "try:\n memgov.claim('1GiB', wait=wait)\nexcept memgov.LockTimeout:\n print('LockTimeout')\n"
    "except memgov.BudgetExceeded:\n print('BudgetExceeded')\n"
)


def test_claims_failed_by_a_held_lock_are_counted(
    sim: str, exporter: Callable[..., Exporter]
) -> None:
    """A real process holds the GPU's admission lock; claims that give up on it with LockTimeout
    are counted (they cannot take that lock to count), a waiter refused at its wait's end is not
    (it is a timeout refusal)."""
    holder = subprocess.Popen(
        [sys.executable, "-c", LOCK_HOLDER], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        ran = [
            subprocess.run(
                [sys.executable, "-c", CLAIM_WITH_SHORT_LOCK_BOUND, wait],
                capture_output=True,
                text=True,
                timeout=120,
            )
            for wait in ("-", "-", "0.3")
        ]
        said = [r.stdout.strip() for r in ran]
        assert said == ["LockTimeout", "LockTimeout", "BudgetExceeded"], ran
        scrape = exporter().scrape()
    finally:
        holder.kill()
        holder.wait()
    counted = scrape["memgov_admission_lock_timeouts_total"]
    assert [(lb["user"], v) for lb, v in counted] == [(pwd.getpwuid(os.geteuid()).pw_name, 2)]


def test_textfile_is_written_whole_and_never_through_a_link(
    sim: str, tmp_path: Path, children: list[Child]
) -> None:
    hold(children, "2GiB", "trainer-a")
    folder = tmp_path / "textfile"
    folder.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    (folder / "memgov.prom").symlink_to(victim)
    done = _memgov("exporter", "--textfile", str(folder), "--once")
    assert done.returncode == 0, done.stderr
    assert victim.read_text() == "untouched"
    written = folder / "memgov.prom"
    assert not written.is_symlink()
    assert claims(parse(written.read_text())) == {"trainer-a": 2 * GIB}
    assert sorted(p.name for p in folder.iterdir()) == ["memgov.prom"]  # no temporary left
    link = tmp_path / "link"
    link.symlink_to(folder)
    refused = _memgov("exporter", "--textfile", str(link), "--once")
    assert refused.returncode == 2 and "a symlink or not a folder" in refused.stderr
    # One write and the process ends: --release-nvml has nothing to release there, and says so.
    pointless = _memgov("exporter", "--textfile", str(folder), "--once", "--release-nvml")
    assert pointless.returncode == 2 and "--release-nvml is for" in pointless.stderr


def _memgov(*args: str, code: str = "") -> subprocess.CompletedProcess[str]:
    prelude = code + "from memgov.cli import main; import sys; sys.argv[0] = 'memgov'; main()"
    return subprocess.run(
        [sys.executable, "-c", prelude, *args], capture_output=True, text=True, timeout=60
    )


def test_without_prometheus_client_one_line_says_how_to_install(sim: str) -> None:
    done = _memgov("exporter", code="import sys; sys.modules['prometheus_client'] = None; ")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'memgov-gpu[exporter]'" in lines[0], done.stderr
    assert (
        _memgov("--help", code="import sys; sys.modules['prometheus_client'] = None; ").returncode
        == 0
    )


@pytest.mark.parametrize("listen", ["nohost", "1.2.3.4:", ":0", ":70000", "a:b:1", "[::1]"])
def test_listen_garbage_says_what_is_accepted(sim: str, listen: str) -> None:
    done = _memgov("exporter", "--listen", listen)
    assert done.returncode == 2
    assert "accepted HOST:PORT, [IPV6]:PORT, :PORT (every interface) or PORT" in done.stderr, (
        done.stderr
    )


@pytest.mark.parametrize("refresh", ["0", "-1", "nan", "soon"])
def test_refresh_garbage_says_what_is_accepted(sim: str, refresh: str) -> None:
    done = _memgov("exporter", "--listen", "127.0.0.1:1", "--refresh", refresh)
    assert done.returncode == 2
    assert "--refresh" in done.stderr and ("0.1" in done.stderr or "number" in done.stderr)


@pytest.mark.parametrize(
    ("path", "container", "pod"),
    [
        ("/system.slice/docker-" + "a" * 64 + ".scope", "a" * 12, ""),
        ("/docker/" + "b" * 64, "b" * 12, ""),
        (
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234abcd_5678_90ab_cdef"
            "_1234567890ab.slice/cri-containerd-" + "c" * 64 + ".scope",
            "c" * 12,
            "1234abcd-5678-90ab-cdef-1234567890ab",
        ),
        (
            "/kubepods/besteffort/pod1234abcd-5678-90ab-cdef-1234567890ab/" + "d" * 64,
            "d" * 12,
            "1234abcd-5678-90ab-cdef-1234567890ab",
        ),
        ("/machine.slice/libpod-" + "e" * 64 + ".scope/container", "e" * 12, ""),
        ("/user.slice/user-0.slice/session-3.scope", "", ""),
        ("", "", ""),
    ],
)
def test_cgroup_paths_name_container_and_pod(path: str, container: str, pod: str) -> None:
    assert parse_cgroup(path) == (container, pod)


def test_docs_list_every_metric(sim: str) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from memgov.exporter.families import MemgovCollector

    registry = CollectorRegistry(auto_describe=False)
    registry.register(MemgovCollector())
    served = set(re.findall(r"^# TYPE (\S+) ", generate_latest(registry).decode(), re.M))
    doc = (ROOT / "docs" / "metrics.md").read_text()
    documented = set(re.findall(r"^\| `(memgov_[a-z_]+)` \|", doc, re.M))
    assert served == documented


def promql_examples() -> list[str]:
    """Every query of docs/metrics.md's examples (one per paragraph) and of the dashboard."""
    doc = (ROOT / "docs" / "metrics.md").read_text()
    block = doc.split("## Example queries")[1].split("```promql")[1].split("```")[0]
    found = [
        " ".join(line.strip() for line in part.splitlines() if not line.startswith("#"))
        for part in block.split("\n\n")
    ]
    dashboard = json.loads(
        (ROOT / "examples" / "monitoring" / "grafana-dashboard.json").read_text()
    )
    found += [
        t["expr"].replace("$host", ".*").replace("$gpu", ".*")
        for p in dashboard["panels"]
        for t in p["targets"]
    ]
    return [q for q in found if q.strip()]


def test_every_promql_example_parses(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip(
            "no promtool (Debian's prometheus package has it; tests/exporter/"
            "test_prometheus.py installs it with --host-changes)"
        )
    queries = promql_examples()
    assert len(queries) >= 20
    rules = {
        "groups": [
            {
                "name": "examples",
                "rules": [{"record": f"example:q{i}", "expr": q} for i, q in enumerate(queries)],
            }
        ]
    }
    path = tmp_path / "rules.yml"
    path.write_text(json.dumps(rules))  # JSON is YAML
    done = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_no_gpu_at_all_is_said_not_hidden(
    fake_nvml: FakeNvml, exporter: Callable[..., Exporter], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_NVML_STATE", str(fake_nvml.path.with_name("absent.json")))
    server = exporter()
    scrape = server.scrape()
    assert scrape["memgov_exporter_devices_listed"] == [({}, 0.0)]
    assert "memgov_gpu_memory_total_bytes" not in scrape
    stop_exporter(server)
    assert "no GPU listed: NVML:" in server.log.read_text()
