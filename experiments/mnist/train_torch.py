"""Keras-example MNIST CNN in PyTorch. Run ``python train_torch.py --help``; reports on stdout.

Framework-only on purpose: memgov governs this process from outside (env vars, import hook),
so nothing here imports memgov or sets thread counts.
"""

from __future__ import annotations

import argparse
from typing import Any

import harness
import numpy as np
import report


class TorchTrainer:
    channels_last = False  # torch convolutions take NCHW

    def __init__(self, args: argparse.Namespace) -> None:
        import torch
        from torch import nn

        self.torch = torch
        if args.device == "gpu" and not torch.cuda.is_available():
            raise report.UsageError("--device gpu: torch sees no GPU")
        use_gpu = args.device != "cpu" and torch.cuda.is_available()
        self.dev = (
            torch.device("cuda", torch.cuda.current_device()) if use_gpu else torch.device("cpu")
        )
        self.device = str(self.dev)
        torch.manual_seed(args.seed)

        self.model = nn.Sequential(
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
        )
        # Keras initialisation (Glorot-uniform weights, zero biases) so the three frameworks
        # train the same model, not three variants of it.
        for m in self.model:
            if isinstance(m, nn.Conv2d | nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                if m.bias is not None:  # always set here; the check is for the type checker
                    nn.init.zeros_(m.bias)
        self.model.to(self.dev)
        self.upload = _Uploader(torch, self.dev)
        # Keras' Adadelta defaults (torch's are rho=0.9, eps=1e-6).
        self.opt = torch.optim.Adadelta(self.model.parameters(), lr=1.0, rho=0.95, eps=1e-7)
        self.loss_fn = nn.CrossEntropyLoss()

    def train_epoch(self, batches: harness.Batches) -> tuple[float, float]:
        torch = self.torch
        self.model.train()
        # Sums stay on the device: a per-step .item() would sync the GPU on every batch.
        loss_sum = torch.zeros((), device=self.dev)
        correct = torch.zeros((), device=self.dev, dtype=torch.int64)
        n = 0
        for xb, yb in batches:
            x, y = self.upload(xb), self.upload(yb)
            logits = self.model(x)
            loss = self.loss_fn(logits, y)
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            self.opt.step()
            loss_sum += loss.detach() * len(yb)
            correct += (logits.argmax(1) == y).sum()
            n += len(yb)
        return loss_sum.item() / n, correct.item() / n

    def predict(self, x: np.ndarray) -> np.ndarray:
        self.model.eval()
        with self.torch.no_grad():
            return self.model(self.torch.from_numpy(x).to(self.dev)).argmax(1).cpu().numpy()

    def hog(self, mib: int) -> object:
        return self.torch.ones(mib << 20, dtype=self.torch.uint8, device=self.dev)

    def peak_allocator_mib(self) -> float | None:
        if self.dev.type != "cuda":
            return None
        return round(self.torch.cuda.max_memory_reserved(self.dev) / 2**20, 1)


class _Uploader:
    """Host batches to the device without a stream sync per step.

    A ``.to(device)`` from pageable memory synchronises the stream before it copies, so the CPU
    waits for the GPU on every batch; with many jobs sharing one GPU that wait dominates. Copies
    from pinned buffers are asynchronous; a small ring of them, each reused only after its copy's
    event has fired, lets the CPU run a few steps ahead.
    """

    SLOTS = 4

    def __init__(self, torch: Any, dev: Any) -> None:
        self.torch = torch
        self.dev = dev
        self.cuda = dev.type == "cuda"
        self.slots: list[tuple[Any, Any] | None] = [None] * (2 * self.SLOTS)  # x and y alternate
        self.turn = 0

    def __call__(self, array: np.ndarray) -> Any:
        if not self.cuda:
            return self.torch.from_numpy(array)
        index = self.turn % len(self.slots)
        self.turn += 1
        slot = self.slots[index]
        if slot is None:
            # Reused (one per batch costs CPU). Blocking: waiting on it sleeps; the default spins
            # a core, and 25 packed jobs spinning left no CPU for the work (all cores 100 % busy).
            buffer, done = None, self.torch.cuda.Event(blocking=True)
        else:
            buffer, done = slot
            done.synchronize()  # the copy out of this buffer has finished
        if buffer is None or tuple(buffer.shape) != array.shape:
            buffer = self.torch.from_numpy(array).pin_memory()
        else:
            buffer.numpy()[...] = array
        moved = buffer.to(self.dev, non_blocking=True)
        done.record()
        self.slots[index] = (buffer, done)
        return moved


if __name__ == "__main__":
    harness.main("torch", TorchTrainer)
