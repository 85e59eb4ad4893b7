"""torchvision's ResNet-50 trained on synthetic images: a big-memory job for the queue's random
mix (benchmarks/queue/make_mixes.py) that needs no download (the GPU machine has no network).
An ordinary user program as far as memgov is concerned: it never imports memgov.

    python resnet_synthetic.py [--arch resnet50] [--batch 128] [--image-size 224] [--steps 30]
                               [--seed N] [--device cuda]

One batch of random images and labels is made on the device and trained on ``--steps`` times
(SGD with momentum, torch's defaults otherwise: TF32 convolutions, no AMP), so the job's memory
is the model's: activations grow with ``--batch`` x ``--image-size``^2. Prints one JSON line at
the end: steps, seconds, images/s, torch's peak allocated and reserved MiB.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from torch import nn


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--arch", default="resnet50", help="a torchvision.models constructor name")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda")
    p.add_argument(
        "--tiny",
        action="store_true",
        help="resnet18, 32x32 images, batch 4 on the CPU (smoke runs)",
    )
    args = p.parse_args()
    if args.tiny:
        args.arch, args.image_size, args.batch, args.device = "resnet18", 32, 4, "cpu"
    for name in ("batch", "image_size", "steps"):
        if getattr(args, name) < 1:
            p.error(
                f"--{name.replace('_', '-')} {getattr(args, name)}: accepted a whole number >= 1"
            )
    return args


def main() -> None:
    args = parse()
    import torchvision

    torch.manual_seed(args.seed)
    model = getattr(torchvision.models, args.arch)(num_classes=1000).to(args.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    images = torch.randn(args.batch, 3, args.image_size, args.image_size, device=args.device)
    labels = torch.randint(0, 1000, (args.batch,), device=args.device)
    cuda = args.device.startswith("cuda")
    start = time.monotonic()
    loss = None
    for _ in range(args.steps):
        loss = loss_fn(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    if cuda:
        torch.cuda.synchronize()
    seconds = time.monotonic() - start
    mib = 2**20
    print(
        json.dumps(
            {
                "arch": args.arch,
                "batch": args.batch,
                "image_size": args.image_size,
                "steps": args.steps,
                "seconds": round(seconds, 3),
                "images_per_s": round(args.steps * args.batch / seconds, 1)
                if seconds > 0
                else None,
                "loss": round(float(loss), 4) if loss is not None else None,
                "peak_allocated_mib": round(torch.cuda.max_memory_allocated() / mib, 1)
                if cuda
                else None,
                "peak_reserved_mib": round(torch.cuda.max_memory_reserved() / mib, 1)
                if cuda
                else None,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
