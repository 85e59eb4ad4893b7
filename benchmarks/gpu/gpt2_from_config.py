"""GPT-2 (124M) built from its config, trained on random tokens: a transformers workload that needs
no download (the GPU machine has no network). A driver of the auto checks (auto_checks.py), and
an unchanged user program as far as memgov is concerned: it never imports memgov.

    python gpt2_from_config.py [--batch 8] [--seq 512] [--steps 20] [--seed N] [--device cuda]

Prints one JSON line at the end: steps, seconds, torch's peak allocated and reserved MiB.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="2 layers, 128 wide (CPU smoke runs)")
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    config = GPT2Config(n_layer=2, n_embd=128, n_head=2) if args.tiny else GPT2Config()
    model = GPT2LMHeadModel(config).to(args.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    start = time.monotonic()
    for _ in range(args.steps):
        ids = torch.randint(0, config.vocab_size, (args.batch, args.seq), device=args.device)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    cuda = args.device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
    print(
        json.dumps(
            {
                "steps": args.steps,
                "seconds": round(time.monotonic() - start, 3),
                "loss": round(float(loss), 4),
                "peak_allocated_mib": round(torch.cuda.max_memory_allocated() / 2**20, 1)
                if cuda
                else None,
                "peak_reserved_mib": round(torch.cuda.max_memory_reserved() / 2**20, 1)
                if cuda
                else None,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
