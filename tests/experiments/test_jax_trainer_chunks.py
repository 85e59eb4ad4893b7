"""The JAX trainer's chunked epoch (one upload and one lax.scan per CHUNK batches, padded chunks,
a short last batch on its own) trains exactly as the textbook per-step loop."""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")
MNIST = Path(__file__).resolve().parents[2] / "experiments" / "mnist"
MODULES = ("harness", "mnist_data", "report", "train_jax")


@pytest.fixture()
def train_jax(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.syspath_prepend(str(MNIST))
    for name in MODULES:
        sys.modules.pop(name, None)
    import train_jax

    yield train_jax
    for name in MODULES:
        sys.modules.pop(name, None)


# Batches of 8: 44 samples are five full batches and a short one of 4.
@pytest.mark.parametrize("n_samples, chunk", [(44, 2), (44, 3), (40, 5)])
def test_chunked_epoch_equals_per_step_loop(train_jax, monkeypatch, n_samples, chunk) -> None:  # type: ignore[no-untyped-def]
    import mnist_data

    monkeypatch.setattr(train_jax, "CHUNK", chunk)
    x, y, _, _ = mnist_data.load(None, None)
    x, y = x[:n_samples], y[:n_samples]
    args = argparse.Namespace(device="cpu", seed=0)

    def epoch_batches() -> list:
        return list(mnist_data.batches(x, y, 8, np.random.default_rng(1), True))

    chunked = train_jax.JaxTrainer(args)
    loss_c, acc_c = chunked.train_epoch(iter(epoch_batches()))

    reference = train_jax.JaxTrainer(args)  # same seed: same initial parameters and key
    step = jax.jit(functools.partial(train_jax._train_step, jax))
    jnp = jax.numpy
    state = (reference.params, reference.opt_state, reference.key)
    sums = (jnp.zeros((), jnp.float32), jnp.zeros((), jnp.int32))
    for xb, yb in epoch_batches():
        *new, sums = step(*state, sums, xb, yb.astype(np.int32))
        state = tuple(new)

    assert loss_c == pytest.approx(float(sums[0]) / n_samples, rel=1e-5)
    assert acc_c == int(sums[1]) / n_samples
    for a, b in zip(
        jax.tree_util.tree_leaves(chunked.params), jax.tree_util.tree_leaves(state[0]), strict=True
    ):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(chunked.key), np.asarray(state[2]))
