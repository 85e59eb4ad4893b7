"""The ledger folder on a fresh machine: MEMGOV_DIR's missing parents are made at the first
claim (examples/docker's replay used /tmp/dockersim/ledger), and `memgov status`, `gc` and
`doctor` only read: they create no folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

GIB = 2**30
MEMGOV = [sys.executable, "-m", "memgov"]


def test_first_claim_makes_missing_parents_of_memgov_dir(env, py, tmp_path):
    ledger = tmp_path / "fresh" / "machine" / "ledger"
    env.update(MEMGOV_DIR=str(ledger), MEMGOV_CLAIM="1GiB")
    code = "import torch, memgov, json; c = memgov.current(); print(json.dumps(c and c.bytes))"
    result = py(code, env)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == GIB
    assert "warning" not in result.stderr
    # A tree its first claimer makes is that user's (0755); a shared one is root's set-up
    # (docs/ledger.md, "Admin set-up"), never a folder another user owns.
    assert ledger.is_dir() and (ledger.stat().st_mode & 0o7777) == 0o755


def test_status_gc_doctor_create_no_folder(env, tmp_path):
    ledger = tmp_path / "not-yet" / "ledger"
    env["MEMGOV_DIR"] = str(ledger)
    # gc run by root is the admin set-up of a shared ledger and makes the folders (tests/hostile)
    reads = (["status"], ["status", "--json"], ["devices"], ["doctor"])
    for argv in reads if os.geteuid() == 0 else (*reads, ["gc"]):
        result = subprocess.run(
            [*MEMGOV, *argv], env=env, capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 0, (argv, result.stderr)
        assert not (tmp_path / "not-yet").exists(), argv
    data = json.loads(
        subprocess.run(
            [*MEMGOV, "status", "--json"], env=env, capture_output=True, text=True, timeout=60
        ).stdout
    )
    assert [(d["uuid"], d["claimed"], d["free"], d["claims"]) for d in data["devices"]] == [
        ("sim0", 0, 16 * GIB, [])
    ]


def test_status_after_a_claim_still_shows_it(env, py, tmp_path: Path):
    env["MEMGOV_CLAIM"] = "1GiB"
    code = (
        "import subprocess, sys, json, torch\n"
        "print(subprocess.run([sys.executable, '-m', 'memgov', 'status', '--json'], "
        "capture_output=True, text=True).stdout)"
    )
    result = py(code, env)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout[result.stdout.index("{") :])
    assert data["devices"][0]["claimed"] == GIB
