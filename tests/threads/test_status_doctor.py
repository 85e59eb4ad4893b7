"""`memgov status` shows each claim's threads; `memgov doctor` says where the number came from."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.threads.test_threads import CORES, NEIGHBOUR, governed, running


def cli(env: dict[str, str], *args: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "memgov", *args, "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_status_and_doctor_show_the_threads(env: dict[str, str]) -> None:
    with (
        running(NEIGHBOUR, governed(env)) as first,
        running(NEIGHBOUR, governed(env, MEMGOV_THREADS="1")) as second,
    ):
        claims = {c["pid"]: c for d in cli(env, "status")["devices"] for c in d["claims"]}
        assert claims[second.proc.pid]["threads"] == 1
        # The first one started alone (all cores); it follows to its share of 2 processes.
        assert claims[first.proc.pid]["threads"] in (CORES, max(1, CORES // 2))
        threads = cli(env, "doctor")["threads"]
        by_pid = {p["pid"]: p for p in threads["governed"]}
        assert by_pid[second.proc.pid]["why"] == "MEMGOV_THREADS=1"
        assert by_pid[first.proc.pid]["why"].startswith("share: ")
        assert f"{CORES} core(s) in the affinity mask" in threads["decision"]
        assert "3 governed process(es) on them (this one included)" in threads["decision"]
        user = cli({**env, "OMP_NUM_THREADS": "3"}, "doctor")["threads"]
        assert user["decision"] == "OMP_NUM_THREADS=3 set by the user: left alone"
