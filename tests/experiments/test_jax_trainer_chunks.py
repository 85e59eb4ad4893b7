"""The JAX trainer's chunked epoch (one upload per chunk of uint8 batches scaled on the device, a
step per batch indexed on the device, a short last batch on its own) trains exactly as the
textbook per-step loop on float batches scaled on the host; compiled ahead (prepare), the same."""

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
@pytest.mark.parametrize(
    "n_samples, chunk, prepared",
    [(44, 2, False), (44, 3, False), (40, 5, False), (44, 2, True), (56, 4, True)],
)
def test_chunked_epoch_equals_per_step_loop(
    train_jax, monkeypatch, n_samples, chunk, prepared
) -> None:
    import mnist_data

    monkeypatch.setattr(train_jax, "CHUNK", chunk)
    x, y, _, _ = mnist_data.load(None, None)
    x, y = x[:n_samples], y[:n_samples]
    args = argparse.Namespace(device="cpu", seed=0)

    def epoch_batches(raw: bool = False) -> list:
        return list(mnist_data.batches(x, y, 8, np.random.default_rng(1), True, raw))

    chunked = train_jax.JaxTrainer(args)
    if prepared:
        info = chunked.prepare(n_samples, 8)
        assert info["compile_s"] >= 0
    loss_c, acc_c = chunked.train_epoch(iter(epoch_batches(raw=True)))

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


def test_prepared_prediction_pads_the_last_batch(train_jax) -> None:
    import mnist_data

    _, _, x, y = mnist_data.load(None, None)
    args = argparse.Namespace(device="cpu", seed=0)
    plain, prepared = train_jax.JaxTrainer(args), train_jax.JaxTrainer(args)
    info = prepared.prepare(64, 16)
    assert info["compile_s"] >= 0
    raw = next(mnist_data.batches(x[:11], y[:11], 16, None, True, raw=True))[0]
    floats = next(mnist_data.batches(x[:11], y[:11], 16, None, True))[0]
    got = prepared.predict(raw)  # 11 images through the program compiled for 16
    assert got.shape == (11,)
    np.testing.assert_array_equal(got, plain.predict(floats))
