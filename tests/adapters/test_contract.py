"""The adapter contract (memgov.adapter), checked against every installed adapter, psutil's way.

Parametrized over the entry points of the ``memgov.adapters`` group, so an adapter added as a folder
and an entry point is checked without touching this file. Each check runs in a fresh interpreter:
whether loading an adapter imports its framework can only be seen in a process that has not.
tests/adapters/test_plugin.py adds a toy framework's adapter as a plugin outside this package and
governs it through every front end.
"""

from __future__ import annotations

import importlib.util
import json
from importlib.metadata import entry_points

import pytest

from memgov.adapter import GROUP

POINTS = sorted(entry_points(group=GROUP), key=lambda p: p.name)
NAMES = [p.name for p in POINTS]


def run_json(py, code: str, env: dict[str, str]) -> dict:
    result = py(code, env)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


LOAD = """
import json, sys
from importlib.metadata import entry_points
from memgov.adapter import GROUP, Adapter, Budget
point = next(p for p in entry_points(group=GROUP) if p.name == {name!r})
adapter = point.load()()
facts = {{"is_adapter": isinstance(adapter, Adapter), "name": adapter.name,
          "module": adapter.module, "framework_on_load": adapter.module in sys.modules,
          "cuda_before_import": adapter.cuda_initialized()}}
growth = Budget(None, "", 0, None, False, "contract")
simulated = Budget(2**30, "sim0", 16 * 2**30, None, True, "contract")
facts["notes"] = [adapter.configure_env(growth), adapter.configure_env(simulated)]
facts["framework_after_configure"] = adapter.module in sys.modules
print(json.dumps(facts))
"""


def test_the_contract_has_adapters_to_check():
    # The [all] extra installs all three; an empty group would make the tests below vacuous.
    assert {"torch", "tensorflow", "jax"} <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_loads_without_its_framework(name, env, py):
    facts = run_json(py, LOAD.format(name=name), env)
    assert facts["is_adapter"], "the class does not follow memgov.adapter.Adapter"
    assert facts["name"] == name, "an adapter's name is its entry point's (Claim.reports key)"
    assert facts["module"] and "." not in facts["module"]
    assert facts["framework_on_load"] is False, "loading an adapter must not import its framework"
    assert facts["cuda_before_import"] is False
    assert all(note is None or isinstance(note, str) for note in facts["notes"])
    assert facts["framework_after_configure"] is False, "configure_env is environment only"


APPLY = """
import json, sys
from importlib.metadata import entry_points
import memgov
from memgov.adapter import GROUP, Budget
point = next(p for p in entry_points(group=GROUP) if p.name == {name!r})
adapter = point.load()()
claim = memgov.claim("1GiB", name="contract")
__import__(adapter.module)
growth = Budget(None, "", 0, None, False, "contract")
simulated = Budget(2**30, "sim0", 16 * 2**30, None, True, "contract")
print(json.dumps({{"claim_report": claim.reports.get(adapter.name),
                   "direct": [adapter.apply(growth), adapter.apply(simulated)],
                   "cuda_after_import": adapter.cuda_initialized()}}))
"""


@pytest.mark.parametrize("name", NAMES)
def test_applies_a_claim_and_reports_one_line(name, env, py):
    point = next(p for p in POINTS if p.name == name)
    module = point.load()().module
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed")
    facts = run_json(py, APPLY.format(name=name), env)
    # A claim made before the import: the import hook applied the budget and filed the report.
    for report in [facts["claim_report"], *facts["direct"]]:
        assert isinstance(report, str) and report.startswith(f"{name}: "), report
        assert "\n" not in report and "FAILED" not in report
    assert facts["cuda_after_import"] is False  # no GPU here, and importing must not start one


def test_auto_enable_reads_the_same_registry(env, py):
    """Auto-enable names the frameworks to hook without importlib.metadata (too slow for every
    interpreter start): it must find what importlib.metadata finds, each adapter's entry point
    named after its framework's module."""
    code = """
import json
from importlib.metadata import entry_points
from memgov._base import importhook as _importhook
points = {p.name: p.load()().module for p in entry_points(group=_importhook.GROUP)}
print(json.dumps({"fast": list(_importhook.frameworks()), "points": points}))
"""
    facts = run_json(py, code, env)
    assert facts["fast"] == sorted(facts["points"])
    assert all(name == module for name, module in facts["points"].items())
