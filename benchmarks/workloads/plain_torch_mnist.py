"""A plain user's PyTorch MNIST loop: never imports memgov, sets no threads.

The Keras-example CNN, batch 32, batches made on the host and copied to the device one at a time,
Adadelta(lr=1.0). Each epoch is a fixed number of steps; per-epoch samples/s go to --out (JSON).
    python benchmarks/workloads/plain_torch_mnist.py --epochs 3 --steps 400 --out job.json
"""

from __future__ import annotations

import time

import _plain_common as common
import numpy as np
import torch
from torch import nn


def main() -> None:
    args = common.parse("torch")
    report = common.Report("torch", args)
    use_gpu = args.device != "cpu" and torch.cuda.is_available()
    if args.device == "gpu" and not use_gpu:
        raise SystemExit("--device gpu: torch sees no GPU")
    dev = torch.device("cuda" if use_gpu else "cpu")
    torch.manual_seed(args.seed)
    model = nn.Sequential(
        nn.Conv2d(1, 32, 3),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Dropout(0.25),
        nn.Flatten(),
        nn.Linear(64 * 12 * 12, 128),
        nn.ReLU(),
        nn.Dropout(0.5),
        nn.Linear(128, 10),
    ).to(dev)
    if args.optimizer == "adam":
        opt: torch.optim.Optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    else:
        opt = torch.optim.Adadelta(model.parameters(), lr=1.0, rho=0.95, eps=1e-7)
    loss_fn = nn.CrossEntropyLoss()
    x_all, y_all = common.data()
    pinned = None
    if args.gather == "pinned":
        x_t = torch.from_numpy(np.array(x_all)).unsqueeze(1).float().div_(255.0)
        y_t = torch.from_numpy(y_all.astype(np.int64))
        pinned = (x_t.pin_memory(), y_t.pin_memory()) if use_gpu else (x_t, y_t)
    rng = np.random.default_rng(args.seed)
    for epoch in range(args.epochs):
        t0 = time.time()
        samples = 0
        loss = None
        for xb, yb in common.batches(x_all, y_all, args.steps, args.batch, rng, pinned):
            if pinned is not None:  # gathered on the CPU (index_select of the pinned tensors)
                x, y = xb.to(dev, non_blocking=True), yb.to(dev, non_blocking=True)
            else:  # host-side conversion, as a typical script does: torch CPU ops
                x = torch.from_numpy(xb).unsqueeze(1).float().div_(255.0).to(dev, non_blocking=True)
                y = torch.from_numpy(yb.astype(np.int64)).to(dev, non_blocking=True)
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            samples += len(yb)
        if loss is not None:
            loss.item()  # one sync per epoch: the epoch's work is done when it is timed
        report.epoch(epoch, samples, t0, time.time(), torch.get_num_threads())
    allocator = {}
    if use_gpu:  # how often the caching allocator hit its cap and freed its cache to retry
        stats = torch.cuda.memory_stats()
        allocator = {
            k: stats.get(k)
            for k in (
                "num_alloc_retries",
                "num_device_alloc",
                "num_device_free",
                "reserved_bytes.all.peak",
            )
        }
    report.done(device=str(dev), torch=torch.__version__, allocator=allocator)


if __name__ == "__main__":
    main()
