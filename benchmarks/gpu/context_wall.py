"""How many CUDA contexts does one GPU accept without MPS, and what sets the limit?

Each client is a bare driver-API process (ctypes on libcuda: cuInit, retain the primary context,
cuMemAlloc of --hold-mib), so host memory per client stays small and the wall measured is the
GPU's, not the host's. Clients start in waves of --step, after each wave the script waits for
every client's verdict, reads MemAvailable and NVML, and stops at the first failure, at --max, or
when MemAvailable drops under --min-avail-gib.

Run once per setting (environment variables given as NAME=VALUE after --env), e.g.
  python3 benchmarks/gpu/context_wall.py --out wall.json --env CUDA_DEVICE_MAX_CONNECTIONS=1
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import time

CLIENT = r"""
import ctypes, os, sys, time
cu = ctypes.CDLL("libcuda.so.1")
def check(rc, what):
    if rc != 0:
        name = ctypes.c_char_p()
        cu.cuGetErrorName(rc, ctypes.byref(name))
        print(f"fail {what} {rc} {name.value.decode() if name.value else '?'}", flush=True)
        sys.exit(1)
check(cu.cuInit(0), "cuInit")
dev = ctypes.c_int()
check(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
ctx = ctypes.c_void_p()
check(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
ptr = ctypes.c_uint64()
check(cu.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(int(sys.argv[1]) << 20)), "cuMemAlloc")
print("ok", flush=True)
sys.stdin.read()  # hold until the parent closes our stdin
"""


def mem_available_gib() -> float:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    return -1.0


def nvml_used_mib() -> float | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        return pynvml.nvmlDeviceGetMemoryInfo(h).used / 2**20
    except Exception:
        return None


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--max", type=int, default=200)
    p.add_argument("--step", type=int, default=20)
    p.add_argument("--hold-mib", type=int, default=256)
    p.add_argument("--min-avail-gib", type=float, default=12.0)
    p.add_argument("--env", nargs="*", default=[])
    a = p.parse_args()
    env = dict(os.environ)
    for kv in a.env:
        k, _, v = kv.partition("=")
        env[k] = v
    clients: list[subprocess.Popen[str]] = []
    waves = []
    failure = None
    t0 = time.monotonic()
    try:
        while len(clients) < a.max and failure is None:
            wave = [
                subprocess.Popen(
                    [sys.executable, "-c", CLIENT, str(a.hold_mib)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    env=env,
                )
                for _ in range(min(a.step, a.max - len(clients)))
            ]
            for c in wave:
                line = (c.stdout.readline() if c.stdout else "").strip()
                if line != "ok" and failure is None:
                    failure = {"client": len(clients) + 1, "said": line}
                if line == "ok":
                    clients.append(c)
                else:
                    c.wait()
            waves.append(
                {
                    "started_ok": len(clients),
                    "mem_available_gib": round(mem_available_gib(), 1),
                    "nvml_used_mib": nvml_used_mib(),
                    "t_s": round(time.monotonic() - t0, 1),
                }
            )
            print(json.dumps(waves[-1]), flush=True)
            if mem_available_gib() < a.min_avail_gib:
                failure = failure or {"stopped": f"MemAvailable < {a.min_avail_gib} GiB"}
    finally:
        for c in clients:
            if c.stdin:
                c.stdin.close()
        for c in clients:
            c.wait(timeout=60)
    result = {
        "env": a.env,
        "hold_mib": a.hold_mib,
        "contexts_ok": len(clients),
        "first_failure": failure,
        "waves": waves,
    }
    print(json.dumps({k: result[k] for k in ("env", "contexts_ok", "first_failure")}), flush=True)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    _ = ctypes  # the client uses ctypes; imported here too so a missing module fails early
    main()
