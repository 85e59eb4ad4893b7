"""One job of the queue's GPU smoke check (benchmarks/gpu/queue_smoke.sh): fixed work on the GPU.

Holds ``--mib`` of GPU memory and runs ``--steps`` matrix products of ``--n`` x ``--n``: a fixed
amount of work, so a job that shares the GPU takes longer and its slowdown is measurable. The
claim comes from the queue (MEMGOV_CLAIM, applied by memgov's auto-enable at ``import torch``).
"""

from __future__ import annotations

import argparse
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=512)
    parser.add_argument("--n", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=400)
    args = parser.parse_args()
    held = torch.empty(args.mib * 2**20, dtype=torch.uint8, device="cuda")
    a = torch.randn(args.n, args.n, device="cuda")
    start = time.perf_counter()
    for _ in range(args.steps):
        a = torch.tanh(a @ a)
    torch.cuda.synchronize()
    print(f"steps {args.steps} in {time.perf_counter() - start:.2f} s; held {held.numel()} bytes")


if __name__ == "__main__":
    main()
