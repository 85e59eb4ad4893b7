"""`memgov status`, `gc` and `devices`: stable JSON keys, what gc removed, clear errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from memgov._ledger.ledger import new_record_name
from memgov.cli import app
from tests.helpers.procs import Child, ledger, wait_until

UID = os.getuid()
"""This user's uid: records the tests write are this user's (root in CI, anyone else too)."""

GIB = 2**30
pytestmark = pytest.mark.usefixtures("sim")
runner = CliRunner()


@pytest.fixture
def holder() -> Iterator[Child]:
    child = Child(["4GiB", "--name", "trainer-a"])
    child.expect("admitted")
    yield child
    child.close()


def test_status_json_has_stable_keys(holder: Child) -> None:
    waiter = Child(["64GiB", "--wait", "30", "--name", "waiting-b"])
    try:
        wait_until(lambda: len(ledger().snapshot().queue) == 1)
        result = runner.invoke(app, ["status", "--json"])
        assert result.exit_code == 0, result.output
        data = json.loads(result.stdout)
    finally:
        waiter.close()
    [dev] = data["devices"]
    assert {"uuid", "total", "used", "claimed", "free", "claims"} <= set(dev)
    assert (dev["uuid"], dev["total"], dev["used"]) == ("sim0", 64 * GIB, 0)
    assert (dev["claimed"], dev["free"]) == (4 * GIB, 60 * GIB)
    [claim] = dev["claims"]
    assert {"name", "pid", "bytes"} <= set(claim)
    assert (claim["name"], claim["pid"], claim["bytes"]) == ("trainer-a", holder.proc.pid, 4 * GIB)
    assert [(q["name"], q["bytes"]) for q in dev["queue"]] == [("waiting-b", 64 * GIB)]
    assert dev["problems"] == []


def test_status_table_for_people(holder: Child) -> None:
    result = runner.invoke(app, ["status"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "trainer-a" in result.stdout and "sim0" in result.stdout
    assert "4.00 GiB" in result.stdout


def test_status_through_the_installed_command(holder: Child) -> None:
    # The real entry point in a fresh interpreter: `python -m memgov` is what `memgov` runs.
    result = subprocess.run(
        [sys.executable, "-m", "memgov", "status", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ),
    )
    assert result.returncode == 0, result.stderr
    names = [c["name"] for c in json.loads(result.stdout)["devices"][0]["claims"]]
    assert names == ["trainer-a"]


@pytest.fixture
def debris(private_ledger: Path) -> dict[str, Path]:
    ledger().snapshot()
    claims = private_ledger / "v1" / "sim0" / "claims"
    dead = claims / new_record_name()
    dead.write_text(
        json.dumps(
            {
                "version": 1,
                "id": "x",
                "kind": "claim",
                "device": "sim0",
                "bytes": GIB,
                "name": "crashed",
                "pid": 99999,
                "created": time.time(),
            }
        )
    )
    old_tmp = claims / ".tmp-half-written.json"
    old_tmp.write_text("{")
    os.utime(old_tmp, (time.time() - 3600, time.time() - 3600))
    foreign = claims / "README.txt"
    foreign.write_text("not memgov's")
    return {"dead": dead, "tmp": old_tmp, "foreign": foreign}


def test_gc_says_what_it_removed_and_skipped(holder: Child, debris: dict[str, Path]) -> None:
    result = runner.invoke(app, ["gc"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert f"removed {debris['dead']} (dead holder, uid {UID})" in lines
    assert f"removed {debris['tmp']} (unfinished write of a dead process, uid {UID})" in lines
    # No live claim is unlocked, whatever its name: gc removes every file no one holds.
    assert f"removed {debris['foreign']} (not a memgov record (unknown name), uid {UID})" in lines
    assert lines[-1] == "3 removed, 0 skipped"
    assert not any(path.exists() for path in debris.values())
    assert [c.name for c in ledger().snapshot().claims] == ["trainer-a"]  # the live one stays
    again = runner.invoke(app, ["gc"])
    assert again.stdout.splitlines()[-1] == "0 removed, 0 skipped"


def test_gc_json(debris: dict[str, Path]) -> None:
    result = runner.invoke(app, ["gc", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert sorted(data) == ["cpu_removed", "rebuilt", "removed", "skipped"]
    assert data["rebuilt"] == []  # no flood: nothing to rebuild
    assert len(data["removed"]) == 3 and data["skipped"] == []


def test_status_does_not_clean(debris: dict[str, Path]) -> None:
    data = json.loads(runner.invoke(app, ["status", "--json"]).stdout)
    assert data["devices"][0]["claimed"] == 0  # the dead record counts nothing...
    assert debris["dead"].exists()  # ...but only gc removes it


def test_devices_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMGOV_DEVICES", "sim0:16GiB,sim1:80GiB:2GiB")
    result = runner.invoke(app, ["devices", "--json"])
    assert result.exit_code == 0, result.output
    found = json.loads(result.stdout)["devices"]
    assert [(d["uuid"], d["total"], d["used"], d["simulated"]) for d in found] == [
        ("sim0", 16 * GIB, 0, True),
        ("sim1", 80 * GIB, 2 * GIB, True),
    ]


@pytest.mark.parametrize(
    ("variable", "value", "says"),
    [
        ("MEMGOV_DEVICES", "sim0:lots", "MEMGOV_DEVICES sim0 total: cannot read 'lots'"),
        ("MEMGOV_DIR", "relative/dir", "MEMGOV_DIR='relative/dir' must be an absolute path"),
        ("MEMGOV_RESERVE", "heaps", "MEMGOV_RESERVE: cannot read 'heaps' as a size"),
    ],
)
@pytest.mark.parametrize("command", [["status", "--json"], ["gc"], ["status"]])
def test_bad_settings_exit_2_with_the_reason(
    command: list[str], variable: str, value: str, says: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(variable, value)
    result = runner.invoke(app, command)
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.startswith("memgov: ") and says in result.stderr
    assert "Traceback" not in result.output


@pytest.mark.parametrize("as_json", [False, True])
def test_status_watch_into_a_pipe_writes_each_snapshot_as_it_is_taken(
    env: dict[str, str], as_json: bool
) -> None:
    # Stopped by a signal, as `timeout` stops it: what it wrote before is there, read as it came.
    import threading

    args = [sys.executable, "-m", "memgov.cli", "status", "--watch", "0.3"]
    proc = subprocess.Popen(
        [*args, *(["--json"] if as_json else [])], env=env, stdout=subprocess.PIPE, text=True
    )
    guard = threading.Timer(60, proc.kill)  # a snapshot that never comes fails, never hangs
    guard.start()
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # returns once the first snapshot is written out
        proc.terminate()
        rest = proc.stdout.read()  # through the reader's own buffer, not around it
    finally:
        guard.cancel()
        proc.kill()
        proc.wait(timeout=30)
    assert first.strip(), "nothing written before the process was stopped"
    if as_json:
        snapshots = [json.loads(line) for line in [first, *rest.splitlines()] if line.strip()]
        assert snapshots and all("devices" in s for s in snapshots)
    else:
        assert "sim0" in first + rest
