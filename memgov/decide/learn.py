"""What the queue learns from finished jobs: each job's solo run time and the slowdown jobs
show when they share a GPU.

**Solo times.** A job that ran alone on its GPU (on average fewer than SOLO_SHARING other queue
jobs beside it) gives its run time as a solo time of its job (the profile's name: the same
command, memgov/_profiles/jobid.py) and of its kind. Expected durations come from these, else from
the job's ``duration`` hint, else they are unknown.

**Slowdown.** A job i sharing its GPU with the set S runs ``s_i = 1 + sum over o in S of
alpha[kind_i, kind_o]`` times slower than alone. The prior is ``alpha = PRIOR_ALPHA`` (0.15) for
every pair, so k jobs of any kinds slow each other by 1 + 0.15 (k - 1): an assumption of this
code, not a measurement, chosen mild so that the first co-locations happen and are measured.
Each finished job whose solo time is known corrects the alphas of the kinds it shared with
(normalised least mean squares on its measured run time / solo time, weighted by how long each
kind ran beside it), so a pair that time-slices (alpha near 1) stops being co-located.

Kept in the queue store (``learned.json``), bounded: MAX_JOBS jobs x KEEP times, MAX_PAIRS pairs.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

PRIOR_ALPHA = 0.15
ALPHA_RANGE = (0.0, 10.0)
LEARNING_RATE = 0.5
SOLO_SHARING = 0.05
KEEP = 8
MAX_JOBS = 512
MAX_PAIRS = 1024


@dataclass
class Learned:
    solo: dict[str, list[float]] = field(default_factory=dict)
    """Job (profile name) or ``kind:KIND`` -> its last solo run times."""
    alpha: dict[str, float] = field(default_factory=dict)
    """``KIND|OTHER`` -> the slowdown one job of OTHER beside a job of KIND adds."""
    util: dict[str, float] = field(default_factory=dict)
    """Job -> its mean GPU utilisation (0-1) when it ran alone, where NVML measured it."""

    # -- reading ----------------------------------------------------------------------------

    def expected(self, job: str, kind: str, hint: float | None) -> float | None:
        """The job's expected solo time: its history, else the hint, else its kind's history."""
        for key in (job,):
            if self.solo.get(key):
                return statistics.median(self.solo[key])
        if hint is not None:
            return hint
        if kind and self.solo.get(f"kind:{kind}"):
            return statistics.median(self.solo[f"kind:{kind}"])
        return None

    def pair(self, kind: str, other: str) -> float:
        return self.alpha.get(f"{kind}|{other}", PRIOR_ALPHA)

    def slowdown(self, kind: str, others: list[str]) -> float:
        """Predicted run time / solo time of a job of ``kind`` beside jobs of ``others``."""
        return 1.0 + sum(self.pair(kind, o) for o in others)

    # -- learning ---------------------------------------------------------------------------

    def finished(
        self, job: str, kind: str, run_s: float, overlap: dict[str, float], solo_s: float | None
    ) -> None:
        """Learn from one finished attempt: ``overlap`` is, per other kind, the time-weighted
        number of its jobs that ran beside this one (job-seconds / run seconds)."""
        sharing = sum(overlap.values())
        if sharing < SOLO_SHARING and run_s > 0:
            self._add_solo(job, run_s)
            if kind:
                self._add_solo(f"kind:{kind}", run_s)
            return
        if solo_s is None or solo_s <= 0 or run_s <= 0:
            return
        observed = run_s / solo_s
        predicted = 1.0 + sum(self.pair(kind, o) * w for o, w in overlap.items())
        norm = sum(w * w for w in overlap.values())
        if norm <= 0:
            return
        step = LEARNING_RATE * (observed - predicted) / norm
        for other, weight in overlap.items():
            key = f"{kind}|{other}"
            value = self.pair(kind, other) + step * weight
            self.alpha[key] = min(max(value, ALPHA_RANGE[0]), ALPHA_RANGE[1])
        while len(self.alpha) > MAX_PAIRS:
            self.alpha.pop(next(iter(self.alpha)))

    def _add_solo(self, key: str, seconds: float) -> None:
        times = self.solo.pop(key, [])  # re-inserted last: the dict's order is recency
        self.solo[key] = [*times, round(seconds, 3)][-KEEP:]
        while len(self.solo) > MAX_JOBS:
            self.solo.pop(next(iter(self.solo)))

    # -- storage ----------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {"version": 1, "solo": self.solo, "alpha": self.alpha, "util": self.util}

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> Learned:
        """From the store's file; anything malformed is dropped (re-learned, never trusted)."""
        if not isinstance(data, dict) or data.get("version") != 1:
            return cls()
        solo = {
            k: [float(x) for x in v if isinstance(x, (int, float)) and x > 0][-KEEP:]
            for k, v in _table(data.get("solo")).items()
            if isinstance(v, list)
        }
        alpha = {
            k: min(max(float(v), ALPHA_RANGE[0]), ALPHA_RANGE[1])
            for k, v in _table(data.get("alpha")).items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        util = {
            k: float(v)
            for k, v in _table(data.get("util")).items()
            if isinstance(v, (int, float)) and 0 <= v <= 1
        }
        return cls(solo, alpha, util)


def _table(value: Any) -> dict[str, Any]:
    return {k: v for k, v in value.items() if isinstance(k, str)} if isinstance(value, dict) else {}
