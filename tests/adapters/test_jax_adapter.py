"""JAX adapter with the real jax/jaxlib: it writes the variables XLA's GPU client reads."""

from __future__ import annotations

import json

import pytest
from memgov_jax import OVERHEAD, pool_fraction

pytest.importorskip("jax")

GIB = 2**30

# Configure through the adapter as a claim on a real (non-simulated) 16 GiB GPU would, then ask
# jaxlib which options its GPU client would be created with (pure Python, needs no GPU).
PLUGIN_OPTIONS = """
import json, os
from memgov.adapter import Budget
from memgov_jax import JaxAdapter
adapter = JaxAdapter()
b = Budget(2 * 2**30, "GPU-x", 16 * 2**30, 0, False, "t")
adapter.configure_env(b)
import jax
from jaxlib import xla_client
options = xla_client.generate_pjrt_gpu_plugin_options()
print(json.dumps({"options": {k: options.get(k) for k in ("memory_fraction", "preallocate")},
                  "report": adapter.apply(b),
                  "vars": {k: os.environ.get(k) for k in
                           ("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION")}}))
"""


def run_json(py, code, env):
    result = py(code, env)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_fraction_and_preallocation_reach_jaxlib(env, py):
    out = run_json(py, PLUGIN_OPTIONS, env)
    expected = float(pool_fraction(2 * GIB, 16 * GIB))
    assert out["options"] == {"memory_fraction": expected, "preallocate": False}
    assert expected == pytest.approx((2 * GIB - OVERHEAD) / (16 * GIB), abs=1e-6)
    assert expected <= (2 * GIB - OVERHEAD) / (16 * GIB)  # rounded down, never up
    assert out["vars"] == {
        "XLA_CLIENT_MEM_FRACTION": None,
        "XLA_PYTHON_CLIENT_MEM_FRACTION": pool_fraction(2 * GIB, 16 * GIB),
    }
    assert out["report"].startswith("jax: preallocation off, pool capped at 1.41 GiB")


def test_user_set_current_name_is_overwritten_not_doubled(env, py):
    """jaxlib raises ValueError when both fraction variables are set."""
    env["XLA_CLIENT_MEM_FRACTION"] = "0.9"
    out = run_json(py, PLUGIN_OPTIONS, env)
    expected = pool_fraction(2 * GIB, 16 * GIB)
    assert out["vars"] == {
        "XLA_CLIENT_MEM_FRACTION": expected,
        "XLA_PYTHON_CLIENT_MEM_FRACTION": None,
    }
    assert out["options"]["memory_fraction"] == float(expected)


def test_backend_started_first_is_reported(env, py):
    code = (
        "import jax.numpy as jnp\njnp.ones(1).block_until_ready()\nimport memgov\n"
        "print(memgov.claim('1GiB').reports['jax'])"
    )
    result = py(code, env)
    assert result.returncode == 0, result.stderr[-3000:]
    report = result.stdout.strip().splitlines()[-1]
    assert report.startswith("jax: the backend had already started before memgov's budget")
    assert "NOT applied to this process: preallocation off" in report


def test_pool_fraction_floor_and_tiny_budgets():
    assert pool_fraction(OVERHEAD // 2, 16 * GIB) == "0.000001"
    assert pool_fraction(32 * GIB, 16 * GIB) == "1.000000"
