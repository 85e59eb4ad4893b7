"""Hugging Face accelerate's big-model placement, called as its docs show: a user's program that
never imports memgov (a governed run gets memgov through auto-enable, MEMGOV_CLAIM).

    python views_accelerate.py [--layers 24 --width 2048] [--run] [--dry]

Builds a GPT-2-shaped model (24 x 2048: 1.3 B parameters, 5.2 GB in float32) on the meta device,
lets ``infer_auto_device_map`` place it from what ``get_max_memory()`` reads
(``torch.cuda.mem_get_info``), and prints one JSON line: the bytes placed on each device and the
free figure accelerate read. ``--run``: then builds the real model on the CPU, dispatches it by
that map (the rest offloaded to the CPU) and runs one forward pass. ``--dry``: a tiny model on a
machine without a GPU (the map only, with max_memory given).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter

import torch
from accelerate import dispatch_model, infer_auto_device_map, init_empty_weights
from accelerate.utils import compute_module_sizes, get_max_memory
from transformers import GPT2Config, GPT2LMHeadModel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--run", action="store_true")
    parser.add_argument("--dry", action="store_true")
    args = parser.parse_args()
    if args.dry:
        args.layers, args.width = 2, 128
    config = GPT2Config(n_layer=args.layers, n_embd=args.width, n_head=16 if not args.dry else 2)
    with init_empty_weights():
        model = GPT2LMHeadModel(config)
    max_memory = {0: 2**20, "cpu": 2**34} if args.dry else get_max_memory()
    device_map = infer_auto_device_map(
        model,
        max_memory=None if not args.dry else max_memory,
        no_split_module_classes=["GPT2Block"],
    )
    sizes = compute_module_sizes(model)
    placed: Counter[str] = Counter()
    for name, where in device_map.items():
        placed[str(where)] += sizes[name]
    result = {
        "model_bytes": sizes[""],
        "max_memory": {str(k): v for k, v in max_memory.items()},
        "placed": dict(placed),
        "modules": {str(k): v for k, v in Counter(map(str, device_map.values())).items()},
    }
    if args.run and not args.dry:
        model = GPT2LMHeadModel(config)  # real weights, on the CPU
        model = dispatch_model(model, device_map=device_map)
        with torch.no_grad():
            out = model(torch.randint(0, config.vocab_size, (1, 64), device="cuda"))
        torch.cuda.synchronize()
        result["ran"] = list(out.logits.shape)
        result["peak_reserved"] = torch.cuda.max_memory_reserved()
        result["free_after"], result["total_seen"] = torch.cuda.mem_get_info()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
