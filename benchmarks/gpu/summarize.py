"""Print the short table verify.sh ends with, from the raw JSON files under $OUT."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def load(out: Path, name: str) -> dict[str, Any]:
    path = out / name
    return json.loads(path.read_text()) if path.exists() else {}


def main(out: Path) -> None:
    rows: list[tuple[str, str]] = []
    torch = load(out, "torch_claim.json").get("results", {})
    for role, res in torch.items():
        done = res.get("done") or {}
        rows.append(
            (
                f"torch claim 2GiB: {role}",
                f"{done.get('result')}, NVML peak {res.get('nvml_peak_mib')} MiB",
            )
        )
    mps = load(out, "mps_checks.json").get("checks", {})
    for name, check in mps.items():
        if isinstance(check, dict) and "passed" in check:
            rows.append((f"mps {name}", "passed" if check["passed"] else "FAILED"))
    pack = load(out, "pack_checks.json").get("summary", {})
    one = pack.get("1_n25_torch", {})
    if one:
        rows.append(
            (
                "pack n=25 torch",
                f"{one.get('ok')}/{one.get('n')} ok, "
                f"{one.get('aggregate_samples_per_s')} samples/s = "
                f"{one.get('x_one_job')}x one job; naive "
                f"{one.get('baseline_aggregate_samples_per_s')} "
                f"({one.get('baseline_x_one_job')}x)",
            )
        )
    two = pack.get("2_n48_nomps", {})
    if two:
        cap = two.get("capacity") or {}
        rows.append(
            (
                "pack n=48 no MPS",
                f"{two.get('ok')}/{two.get('n')} ok, est. max "
                f"{cap.get('max_jobs')} jobs ({cap.get('binding')})",
            )
        )
    dense = pack.get("2b_dense_nomps", {})
    if dense.get("n"):
        gate = dense.get("host_gate") or {}
        rows.append(
            (
                "pack dense no MPS",
                f"{dense.get('ok')}/{dense.get('n')} ok, at most "
                f"{gate.get('most_running')} at once, {gate.get('jobs_that_waited')} waited "
                f"(host memory {gate.get('per_job_mib')} MiB/job); device peak "
                f"{dense.get('device_peak_used_mib')} MiB",
            )
        )
    jax = pack.get("3_jax", {})
    if jax:
        rows.append(
            (
                "pack JAX greedy / claim",
                f"{jax.get('greedy_ok')}/{jax.get('greedy_n')} "
                f"ok ({jax.get('greedy_reasons')}) / {jax.get('claim_ok')}/"
                f"{jax.get('claim_n')} ok, max {jax.get('claim_footprint_max_mib')} MiB",
            )
        )
    rogue = pack.get("4_rogue", {})
    if rogue:
        reasons = [f"job {j['index']}: {j['reason']}" for j in rogue.get("failed", [])]
        rows.append(("pack 24 good + 1 rogue", f"{rogue.get('ok')}/{rogue.get('n')} ok; {reasons}"))
    five = pack.get("5_one_job_epoch", {})
    if five:
        rows.append(("epoch, claim / none", f"ratio {five.get('ratio_median')}"))
    width = max((len(r[0]) for r in rows), default=10)
    print("\n== memgov GPU checks")
    for left, right in rows:
        print(f"{left:<{width}}  {right}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
