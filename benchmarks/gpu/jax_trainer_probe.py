"""Why does experiments/mnist's JAX trainer run at about half a minimal jit loop's speed?

Times one process's training steps (solo, GPU) in variants that each remove one suspect:

- ``trainer``: the trainer's own step and the harness's host batches (float32, shuffled), as packed;
- ``prefetch``: the same step, the next batch uploaded with ``jax.device_put`` before this step is
  dispatched (the host no longer hands numpy arrays to the jitted call);
- ``resident``: the same step, every batch uploaded before the clock starts (upper bound: no
  upload cost at all);
- ``resident_nodrop``: as ``resident`` without dropout's random numbers (the RNG's cost);
- ``minimal``: a minimal jit loop, SGD and no dropout, host numpy batches (the baseline the
  issue quotes: ~50,000 samples/s).

Usage: python3 benchmarks/gpu/jax_trainer_probe.py --out probe.json [--steps 1500]
Prints one line per variant (steps/s, samples/s) and writes them as JSON.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "experiments" / "mnist"))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import mnist_data  # noqa: E402
import train_jax  # noqa: E402


def host_batches(x: np.ndarray, y: np.ndarray, batch: int, seed: int):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    while True:
        for xb, yb in mnist_data.batches(x, y, batch, rng, True):
            yield xb, yb.astype(np.int32)


def timed(name: str, step, state, batches, steps: int, warm: int = 50) -> dict:  # type: ignore[no-untyped-def]
    for _ in range(warm):
        state = step(state, *next(batches))
    jax.block_until_ready(state)
    t0 = time.perf_counter()
    for _ in range(steps):
        state = step(state, *next(batches))
    jax.block_until_ready(state)
    dt = time.perf_counter() - t0
    row = {
        "variant": name,
        "steps": steps,
        "seconds": round(dt, 4),
        "steps_per_s": round(steps / dt, 1),
    }
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--batch", type=int, default=32)
    a = p.parse_args()
    x, y, _, _ = mnist_data.load(None, None)
    dev = jax.devices()[0]
    print(f"device {dev}, jax {jax.__version__}", flush=True)
    key = jax.random.PRNGKey(0)
    params0 = jax.device_put(train_jax._init_params(jax, key), dev)
    zeros = functools.partial(jax.tree_util.tree_map, jnp.zeros_like)

    def fresh():  # type: ignore[no-untyped-def]
        p = jax.tree_util.tree_map(jnp.array, params0)
        return (
            p,
            (zeros(p), zeros(p)),
            jax.random.PRNGKey(1),
            (jnp.zeros(()), jnp.zeros((), jnp.int32)),
        )

    jstep = jax.jit(functools.partial(train_jax._train_step, jax), donate_argnums=(0, 1, 2, 3))

    def trainer_step(state, xb, yb):  # type: ignore[no-untyped-def]
        return jstep(*state, xb, yb)

    rows = []
    rows.append(timed("trainer", trainer_step, fresh(), host_batches(x, y, a.batch, 0), a.steps))

    def prefetched(it):  # type: ignore[no-untyped-def]
        nxt = jax.device_put(next(it), dev)
        while True:
            cur, nxt = nxt, jax.device_put(next(it), dev)
            yield cur

    rows.append(
        timed(
            "prefetch", trainer_step, fresh(), prefetched(host_batches(x, y, a.batch, 0)), a.steps
        )
    )

    it = host_batches(x, y, a.batch, 0)
    resident = [jax.device_put(next(it), dev) for _ in range(a.steps + 60)]
    rows.append(timed("resident", trainer_step, fresh(), iter(resident), a.steps))

    def nodrop_step_fn(params, opt_state, key, sums, xb, yb):  # type: ignore[no-untyped-def]
        def loss_fn(p):  # type: ignore[no-untyped-def]
            logits = train_jax._forward(jax, p, xb, None)
            logp = jax.nn.log_softmax(logits)
            return -jnp.mean(jnp.take_along_axis(logp, yb[:, None], axis=1)), logits

        (loss, _), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        params = jax.tree_util.tree_map(lambda w, g: w - 0.01 * g, params, grads)
        return params, opt_state, key, (sums[0] + loss, sums[1])

    nd = jax.jit(nodrop_step_fn, donate_argnums=(0, 1, 2, 3))
    rows.append(
        timed("resident_nodrop", lambda s, xb, yb: nd(*s, xb, yb), fresh(), iter(resident), a.steps)
    )
    rows.append(
        timed(
            "minimal",
            lambda s, xb, yb: nd(*s, xb, yb),
            fresh(),
            host_batches(x, y, a.batch, 0),
            a.steps,
        )
    )
    for r in rows:
        r["samples_per_s"] = round(r["steps_per_s"] * a.batch, 1)
    Path(a.out).write_text(
        json.dumps({"device": str(dev), "batch": a.batch, "rows": rows}, indent=1)
    )
    print(f"{'variant':<18}{'steps/s':>10}{'samples/s':>12}")
    for r in rows:
        print(f"{r['variant']:<18}{r['steps_per_s']:>10}{r['samples_per_s']:>12}")


if __name__ == "__main__":
    main()
