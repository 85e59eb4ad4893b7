"""`docker kill`, `docker stop` and Ctrl-C against a running `memgov pack --runner docker`.

    python tests/docker/killstop_check.py OUT_DIR [IMAGE]

Starts a docker pack of 3 long jobs (1,000 tiny epochs each: the test ends them all) on a
private ledger, waits until all 3 claims are in the ledger, then: `docker kill` of the first
container (how long until its claim is gone), `docker stop` of the second (the same), SIGINT to
pack (as Ctrl-C at its terminal sends) and, once pack has exited: pack's containers left
(`docker ps -a`), claim records left, and the report's exit reasons. Prints one JSON object;
tests/docker/test_containers.py asserts on it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MNIST = ROOT / "experiments" / "mnist"


def _claims(ledger: Path) -> dict[str, str]:
    """Live claims on sim0 as {hostname: record} (a container's hostname is its name)."""
    env = {**os.environ, "MEMGOV_DIR": str(ledger), "MEMGOV_DEVICES": "sim0:16GiB"}
    got = subprocess.run(
        [sys.executable, "-m", "memgov", "status", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    data = json.loads(got.stdout)
    return {c["host"]: c["record"] for d in data["devices"] for c in d["claims"]}


def _until_gone(ledger: Path, host: str, t0: float, limit: float = 60.0) -> dict[str, Any]:
    """Seconds until ``host``'s claim is gone, and how many looks at the ledger that took."""
    looks = 0
    while time.monotonic() - t0 < limit:
        looks += 1
        if host not in _claims(ledger):
            return {"s": round(time.monotonic() - t0, 3), "looks": looks}
        time.sleep(0.05)
    return {"s": None, "looks": looks}


def _docker(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["docker", *args], capture_output=True, text=True, timeout=120, check=False
    )


def pack_argv(image: str, *options: str) -> list[str]:
    """``memgov pack`` in containers of IMAGE on the CPU (the docker tests' packs), then OPTIONS."""
    runner = ["--runner", "docker", "--image", image, "--device", "cpu"]
    return [sys.executable, "-m", "memgov", "pack", *runner, *options]


def run(out: Path, image: str = "memgov-mnist") -> dict[str, Any]:
    ledger = out / "ledger"
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "MEMGOV_DIR": str(ledger)}
    env.pop("MEMGOV_DEVICES", None)
    argv = pack_argv(
        image,
        "--n",
        "3",
        "--epochs",
        "1000",  # whatever the machine's speed, still training when their turn comes
        "--no-solo",
        "--no-progress",
        "--host-per-job",
        "off",
        "--out",
        str(out / "pack"),
        str(MNIST),
        "--",
        "--limit",
        "128",
        "--eval-limit",
        "32",
    )
    result: dict[str, Any] = {"command": argv}
    with open(out / "pack.log", "wb") as log:
        pack = subprocess.Popen(
            argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    claims: dict[str, str] = {}
    try:
        deadline = time.monotonic() + 300
        while len(claims) < 3:
            if time.monotonic() > deadline or pack.poll() is not None:
                raise RuntimeError(
                    f"3 claims never appeared (pack exit {pack.poll()}); "
                    + (out / "pack.log").read_text()[-1500:]
                )
            time.sleep(0.5)
            claims = {h: r for h, r in _claims(ledger).items() if h.startswith("memgov-pack-")}
        names = sorted(claims)
        result["claims_before"] = claims
        killed, stopped, interrupted = names
        # Timed from the moment the docker command returned (the container is gone then); each
        # look at the ledger is a `memgov status --json` process, so the figure includes one.
        t0 = time.monotonic()
        _claims(ledger)
        result["one_look_s"] = round(time.monotonic() - t0, 3)
        result["docker_kill"] = _docker("kill", killed).returncode
        result["kill_claim_gone_s"] = _until_gone(ledger, killed, time.monotonic())
        result["docker_stop"] = _docker("stop", stopped).returncode
        result["stop_claim_gone_s"] = _until_gone(ledger, stopped, time.monotonic())
        result["left_running"] = interrupted
        t0 = time.monotonic()
        pack.send_signal(signal.SIGINT)  # what Ctrl-C at pack's terminal sends
        result["pack_exit"] = pack.wait(timeout=120)
        result["pack_exit_after_s"] = round(time.monotonic() - t0, 3)
    finally:
        if pack.poll() is None:
            pack.kill()
            pack.wait()
            # pack could not stop its containers: they would train on for their 1,000 epochs
            for name in claims:
                _docker("rm", "-f", name)
    listed = _docker("ps", "-a", "--filter", "name=^memgov-pack-", "--format", "{{.Names}}")
    result["containers_left"] = [
        n for n in listed.stdout.split() if n in result.get("claims_before", {})
    ]
    result["claims_left"] = _claims(ledger)
    result["record_files_left"] = sorted(
        p.name for p in (ledger / "v1" / "sim0" / "claims").glob("*.json")
    )
    report = json.loads((out / "pack" / "report.json").read_text())
    by_host = {j["container"]: j for j in report["jobs"]}
    result["jobs"] = {
        role: {
            k: by_host[name][k]
            for k in (
                "label",
                "status",
                "reason",
                "detail",
                "exit_code",
                "signal",
                "claim_mib",
                "uss_mib",
            )
        }
        for role, name in (
            ("docker_kill", killed),
            ("docker_stop", stopped),
            ("ctrl_c", interrupted),
        )
    }
    result["report_interrupted"] = report["interrupted"]
    return result


if __name__ == "__main__":
    got = run(Path(sys.argv[1]), *(sys.argv[2:3]))
    print(json.dumps(got, indent=1, sort_keys=True))
