"""Scrape latency and memory of `memgov exporter`, with many governed processes holding claims.

    python benchmarks/cpu/exporter_scrape.py [--url URL --pid PID] [--holders K] [--size 512MiB]
        [--exporter-args=OPTIONS ...]
        [--wait-claims N] [--scrapes 100] [--hogs H] [--tree DIR ...] [--out PATH.json]

Without --url it starts `python -m memgov exporter --listen 127.0.0.1:PORT` itself (the ledger
and GPUs of its environment: MEMGOV_DIR, MEMGOV_DEVICES or NVML) and stops it at the end; with
--url it scrapes a running exporter (--pid names its process, for the memory figures).
--holders K starts K sleeper processes that each claim --size and hold it (bounded start-up,
stopped at the end; they inherit the environment, so MEMGOV_THREADS=once keeps their CPU-share
followers from re-reading the ledger every second); --wait-claims N waits (at most 600 s) until
the scrape shows N claims, e.g. the jobs of a `memgov pack --n 140` started beside it. --hogs H
starts H processes that only burn CPU (in this script's session, as pack's jobs share the session
of the script that starts them on the GPU machine), to saturate the cores as pack's 140 jobs did:
after the exporter is up (a service is up before the load comes), for the scrapes only.
--tree DIR (repeatable) runs the started exporter from that memgov tree (PYTHONPATH=DIR first), one
after another beside the same holders and hogs: before and after in one run. Then it
times --scrapes full HTTP GETs of /metrics, one after another (p50, p99 by nearest rank, max),
and reads the exporter's RSS, PSS, USS (smaps_rollup), peak RSS (VmHWM) and where its memory is,
mapping by mapping (benchmarks/common/smaps.py), after them. --exporter-args (repeatable) starts
the exporter with those options, one after another beside the same load. Beside them: the exporter's
own per-GPU figures from the last scrape and NVML's (device used and total, process count),
where NVML answers. JSON to --out.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))
import smaps  # benchmarks/common/smaps.py

SLEEPER = (
    "import memgov, sys, time\n"
    "claim = memgov.claim(sys.argv[1], name=sys.argv[2], wait=600)\n"
    "print('held', flush=True)\n"
    "sys.stdin.readline()\n"
)
START_S = 600.0


def options(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="scrape this exporter instead of starting one")
    parser.add_argument("--pid", type=int, help="with --url: the exporter's process")
    parser.add_argument("--holders", type=int, default=0, help="sleeper processes to start")
    parser.add_argument("--size", default="512MiB", help="each sleeper's claim")
    parser.add_argument("--wait-claims", type=int, default=0, help="claims to wait for")
    parser.add_argument("--scrapes", type=int, default=100)
    parser.add_argument("--hogs", type=int, default=0, help="CPU-burning processes to start")
    parser.add_argument(
        "--hogs-session",
        choices=("same", "own"),
        default="same",
        help="same: the hogs share this script's (and the exporter's) session, as pack's jobs "
        "did on the GPU machine; own: their own session, as a user's jobs beside a service",
    )
    parser.add_argument(
        "--tree", action="append", default=[], help="memgov tree to run the exporter from"
    )
    parser.add_argument(
        "--exporter-args",
        action="append",
        default=[],
        help="options for the started `memgov exporter`, as one string (e.g. '--release-nvml'); "
        "repeated: one exporter after another, each with its own options, beside the same load",
    )
    parser.add_argument("--out", type=Path, help="JSON file to write")
    args = parser.parse_args(argv)
    if args.scrapes < 1 or args.holders < 0 or args.wait_claims < 0:
        parser.error("--scrapes: accepted a whole number >= 1; --holders, --wait-claims >= 0")
    if args.pid is not None and args.url is None:
        parser.error("--pid goes with --url (a started exporter's PID is known)")
    if (args.tree or args.exporter_args) and args.url is not None:
        parser.error("--tree and --exporter-args go without --url (they pick the started exporter)")
    if args.tree and args.exporter_args:
        parser.error("--tree or --exporter-args: one of them varies the started exporter")
    return args


def percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(pct / 100 * len(ordered))) - 1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as response:
        return bytes(response.read())


def start_exporter(
    tree: str | None = None, options: str = ""
) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [tree, env.get("PYTHONPATH")]))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "memgov",
            "exporter",
            "--listen",
            f"127.0.0.1:{port}",
            *options.split(),
        ],
        stderr=subprocess.DEVNULL,
        env=env,
        cwd=tree,  # `python -m` puts the working folder first on sys.path: the tree's memgov
    )
    url = f"http://127.0.0.1:{port}/metrics"
    deadline = time.monotonic() + START_S
    while True:
        try:
            fetch(url)
            return proc, url
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                stop([proc])
                raise SystemExit(f"the exporter did not answer within {START_S:g} s") from None
            time.sleep(0.1)


def start_holders(k: int, size: str) -> list[subprocess.Popen[str]]:
    """K sleepers, started in steps of 10 (each step waits for its claims, bounded)."""
    procs: list[subprocess.Popen[str]] = []
    deadline = time.monotonic() + START_S
    for first in range(0, k, 10):
        step = [
            subprocess.Popen(
                [sys.executable, "-c", SLEEPER, size, f"sleeper-{i}"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            for i in range(first, min(k, first + 10))
        ]
        procs.extend(step)
        for proc in step:
            assert proc.stdout is not None
            if time.monotonic() > deadline or proc.stdout.readline().strip() != "held":
                stop(procs)
                raise SystemExit(f"sleeper {proc.pid} did not hold its claim")
    return procs


HOG = "while True: pass"
HOGS_SETTLE_S = 10.0


def start_hogs(h: int, own_session: bool) -> list[subprocess.Popen[bytes]]:
    return [
        subprocess.Popen([sys.executable, "-c", HOG], start_new_session=own_session)
        for _ in range(h)
    ]


def stop(procs: list[Any]) -> None:
    for proc in procs:
        with contextlib.suppress(OSError):
            proc.terminate()
    for proc in procs:
        with contextlib.suppress(Exception):
            proc.wait(timeout=30)


def claims_in(text: bytes) -> int:
    return sum(1 for line in text.splitlines() if line.startswith(b"memgov_claim_budget_bytes{"))


def memory(pid: int) -> dict[str, Any]:
    """RSS, PSS, USS (smaps_rollup), peak RSS (VmHWM) and the per-mapping breakdown (smaps.py)."""
    peak = None
    with contextlib.suppress(OSError, ValueError), open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                peak = int(line.split()[1]) * 1024
    totals = smaps.rollup(pid)
    return {
        "rss_bytes": totals["Rss"] * 1024,
        "pss_bytes": totals["Pss"] * 1024,
        "uss_bytes": totals["Uss"] * 1024,
        "anonymous_bytes": totals["Anonymous"] * 1024,
        "peak_rss_bytes": peak,
        "rss_mib": totals["Rss"] / 1024,
        "pss_mib": totals["Pss"] / 1024,
        "uss_mib": totals["Uss"] / 1024,
        "smaps_rollup_kb": totals,
        "breakdown_kb": smaps.breakdown(pid),
        "breakdown_text": smaps.show(pid),
    }


def gpu_figures(text: bytes) -> dict[str, Any]:
    """The exporter's per-GPU figures and NVML's, read now, side by side."""
    from prometheus_client.parser import text_string_to_metric_families

    mine: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text.decode()):
        if family.name.startswith("memgov_gpu_") and family.name != "memgov_gpu_claims":
            for sample in family.samples:
                mine.setdefault(sample.labels.get("UUID", "?"), {})[sample.name] = sample.value
    nvml: dict[str, Any] = {}
    try:
        import pynvml

        pynvml.nvmlInit()
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
            nvml[uuid] = {
                "total_bytes": mem.total,
                "used_bytes": mem.used,
                "compute_processes": len(procs),
            }
    except Exception as exc:  # no driver, no GPU: said, not hidden
        nvml = {"unavailable": f"{type(exc).__name__}: {exc}"}
    return {"exporter": mine, "nvml": nvml}


def measure(url: str, scrapes: int) -> tuple[list[float], list[int], bytes]:
    seconds: list[float] = []
    sizes: list[int] = []
    body = b""
    for _ in range(scrapes):
        start = time.perf_counter()
        body = fetch(url)
        seconds.append(time.perf_counter() - start)
        sizes.append(len(body))
    return seconds, sizes, body


def run_one(
    args: argparse.Namespace, tree: str | None, holders: int, options: str = ""
) -> dict[str, Any]:
    """Start (or reach) one exporter, wait for the claims, time the scrapes."""
    exporter = None
    hogs: list[subprocess.Popen[bytes]] = []
    try:
        if args.url is None:
            exporter, url = start_exporter(tree, options)
            pid: int | None = exporter.pid
        else:
            url, pid = args.url, args.pid
        waited = time.monotonic()
        while claims_in(fetch(url)) < args.wait_claims:
            if time.monotonic() - waited > START_S:
                raise SystemExit(f"fewer than {args.wait_claims} claims after {START_S:g} s")
            time.sleep(1)
        fetch(url)  # one warm-up scrape (imports, first NVML init) outside the timing
        # The exporter is a service, up before the load comes: the hogs start now, and the
        # scrapes once they have run for HOGS_SETTLE_S.
        hogs = start_hogs(args.hogs, args.hogs_session == "own")
        time.sleep(HOGS_SETTLE_S if hogs else 0)
        load_before = os.getloadavg()
        seconds, sizes, body = measure(url, args.scrapes)
        return {
            "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
            "tree": tree,
            "exporter_args": options,
            "host": platform.node(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "memgov_devices": os.environ.get("MEMGOV_DEVICES"),
            "memgov_threads": os.environ.get("MEMGOV_THREADS"),
            "hogs": args.hogs,
            "hogs_session": args.hogs_session,
            "load_average_before": load_before,
            "load_average_after": os.getloadavg(),
            "holders_started": holders,
            "claims_in_last_scrape": claims_in(body),
            "scrapes": len(seconds),
            "bytes_per_scrape_max": max(sizes),
            "latency_ms": {
                "p50": percentile(seconds, 50) * 1000,
                "p99": percentile(seconds, 99) * 1000,
                "max": max(seconds) * 1000,
                "all": [s * 1000 for s in seconds],
            },
            "body_age_s": body_age(body),
            "refresh_s": refresh_seconds(body),
            "exporter_memory": memory(pid) if pid is not None else None,
            "gpus": gpu_figures(body),
        }
    finally:
        stop(hogs)
        if exporter is not None:
            stop([exporter])


def refresh_seconds(text: bytes) -> float | None:
    """How long the refresh before the one that made this body took, as the body says."""
    for line in text.splitlines():
        if line.startswith(b"memgov_exporter_refresh_seconds "):
            return float(line.split()[1])
    return None


def body_age(text: bytes) -> float | None:
    """Seconds between the last scrape and the refresh that made its body, where it says."""
    for line in text.splitlines():
        if line.startswith(b"memgov_exporter_last_refresh_timestamp_seconds "):
            return time.time() - float(line.split()[1])
    return None


def main(argv: list[str] | None = None) -> int:
    args = options(argv)
    holders: list[subprocess.Popen[str]] = []
    results: list[dict[str, Any]] = []
    several = bool(args.tree or args.exporter_args)
    try:
        holders = start_holders(args.holders, args.size)
        for tree in args.tree or [None]:
            for extra in args.exporter_args or [""]:
                results.append(run_one(args, tree, len(holders), extra))
                show(results[-1])
                if args.out is not None:  # after each run: a later one cut short loses only itself
                    text = json.dumps(results if several else results[0], indent=2, sort_keys=True)
                    args.out.write_text(text + "\n")
    finally:
        stop(holders)
    return 0


def show(result: dict[str, Any]) -> None:
    lat, mem = result["latency_ms"], result["exporter_memory"] or {}
    age = result["body_age_s"]
    peak = (mem.get("peak_rss_bytes") or 0) / 2**20
    took = "-" if result.get("refresh_s") is None else f"{result['refresh_s']:.3f} s"
    name = " ".join(filter(None, [result["tree"] or "exporter", result.get("exporter_args")]))
    print(
        f"{name}: {result['claims_in_last_scrape']} claims, "
        f"{result['scrapes']} scrapes, {result['hogs']} hogs ({result['hogs_session']} session), "
        f"load "
        f"{result['load_average_after'][0]:.1f}: p50 {lat['p50']:.2f} ms, p99 {lat['p99']:.2f} ms, "
        f"max {lat['max']:.2f} ms; exporter RSS {mem.get('rss_mib', 0):.1f} MiB, PSS "
        f"{mem.get('pss_mib', 0):.1f} MiB, USS {mem.get('uss_mib', 0):.1f} MiB, peak RSS {peak:.1f}"
        f" MiB; body age {'-' if age is None else f'{age:.2f} s'}; a refresh took {took}",
        flush=True,
    )
    if mem.get("breakdown_text"):
        print(mem["breakdown_text"], flush=True)
    gpus = result["gpus"]
    for uuid, mine in gpus["exporter"].items():
        nvml = gpus["nvml"].get(uuid, gpus["nvml"])
        print(f"  {uuid}: exporter {json.dumps(mine, sort_keys=True)}; NVML {json.dumps(nvml)}")


if __name__ == "__main__":
    sys.exit(main())
