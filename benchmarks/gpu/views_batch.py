"""A user's script that sizes its batch from free device memory, the way many do: it never
imports memgov (a governed run gets memgov through auto-enable, MEMGOV_CLAIM).

    python views_batch.py [--steps 10] [--fill 0.7] [--dry]

It measures one sample's memory from two small probe steps, takes ``fill`` of
``torch.cuda.mem_get_info()``'s free figure for its batch, trains ``steps`` steps and prints one
JSON line: the figures it read, the batch it chose, its peak, and whether it ran out of memory.
``--dry`` (CPU, no GPU): the same steps on the CPU with a made-up free figure.
"""

from __future__ import annotations

import argparse
import json

import torch


def step(model: torch.nn.Module, batch: int, device: str) -> None:
    x = torch.randn(batch, 2048, device=device)
    model(x).square().mean().backward()
    model.zero_grad(set_to_none=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--fill", type=float, default=0.7)
    parser.add_argument("--dry", action="store_true")
    args = parser.parse_args()
    device = "cpu" if args.dry else "cuda"
    layers = [torch.nn.Sequential(torch.nn.Linear(2048, 2048), torch.nn.GELU()) for _ in range(8)]
    model = torch.nn.Sequential(*layers).to(device)
    free, total = (2**30, 2**31) if args.dry else torch.cuda.mem_get_info()
    peaks = []
    probes = (512, 4096)  # large enough that the activations, not the allocator's rounding, grow
    for batch in probes:  # one sample's memory: the peak's growth per sample
        if not args.dry:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        step(model, batch, device)
        peaks.append(0 if args.dry else torch.cuda.max_memory_allocated() - base)
    grown = (peaks[1] - peaks[0]) // (probes[1] - probes[0])
    per_sample = max(1, grown) if not args.dry else 2**27
    # The probe steps' cache is free memory for this process: count it as torch's own does.
    reserved_free = 0 if args.dry else torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
    batch = max(1, int(args.fill * (free + reserved_free) / per_sample))
    result = {"free": free, "total": total, "per_sample": per_sample, "batch": batch}
    try:
        for _ in range(args.steps):
            step(model, batch, device)
        if not args.dry:
            torch.cuda.synchronize()
        result["oom"] = False
    except torch.OutOfMemoryError as exc:
        result["oom"] = True
        result["error"] = str(exc).splitlines()[0][:300]
    if not args.dry:
        result["peak_reserved"] = torch.cuda.max_memory_reserved()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
