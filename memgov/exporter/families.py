"""The metric families of one scrape: a prometheus_client Collector over ``model.read()``.

prometheus_client writes the exposition format and escapes label values; this module only cleans
what the format cannot carry (lone surrogates from JSON escapes, control characters) and bounds
each value's length, so any record another user can write yields a valid scrape. Every name,
type and label is listed in docs/metrics.md (tests/exporter checks that the lists agree).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from memgov._ledger import stats as _stats
from memgov._ledger.parse import printable
from memgov.exporter import model
from memgov.exporter.holders import user_name

GPU_LABELS = ["gpu", "UUID", "modelName", "Hostname"]
"""dcgm-exporter's names for the same things, so that queries can join on them."""
CLAIM_LABELS = [
    *GPU_LABELS,
    "claim",
    "name",
    "pid",
    "user",
    "mode",
    "holder_host",
    "container",
    "pod",
    "pod_uid",
    "namespace",
]
MAX_LABEL = 256


def label(text: object) -> str:
    """A label value any record can produce, safe for the format: printable, valid UTF-8,
    at most MAX_LABEL characters."""
    clean = printable(str(text)[:MAX_LABEL])[:MAX_LABEL]
    return clean.encode("utf-8", "replace").decode("utf-8")


REFRESH_REASONS = ("start", "interval", "change")
"""Why a refresh ran: the first one, the refresh interval, or a change in the ledger (a record
added or removed, a watched holder's death; memgov/exporter/refresh.py)."""


class MemgovCollector(Collector):
    """Reads the ledger and NVML on every collect(): one collect is one refresh of the body that
    `memgov exporter` serves (memgov/exporter/refresh.py), or one write of --textfile."""

    def __init__(self, read: Any = model.read) -> None:
        self._read = read
        self._said: set[str] = set()
        self.last_reading: model.Reading | None = None
        """The reading of the last collect (the refresher watches its holders)."""
        self.refreshes = dict.fromkeys(REFRESH_REASONS, 0)
        """Refreshes so far by reason, counted by the refresher before each collect."""
        self.previous_seconds = 0.0
        """How long the previous refresh took, reading and rendering (0 before the first)."""

    def collect(self) -> Iterator[Metric]:
        started = time.time()
        reading = self._read()
        self.last_reading = reading
        self._log(reading)
        yield from _gpu_families(reading)
        yield from _claim_families(reading)
        yield from _counter_families(reading)
        yield from _queue_families(reading)
        yield from self._refresh_families(started, reading)
        yield _gauge(
            "memgov_exporter_devices_listed",
            "1 when the GPUs could be listed (NVML or MEMGOV_DEVICES), else 0.",
            [],
            [([], 0 if reading.error else 1)],
        )

    def _refresh_families(self, started: float, reading: model.Reading) -> Iterator[Metric]:
        yield _gauge(
            "memgov_exporter_read_seconds",
            "Seconds the refresh that made this body took to read the ledger and NVML.",
            [],
            [([], reading.seconds)],
        )
        yield _gauge(
            "memgov_exporter_last_refresh_timestamp_seconds",
            "Unix time at which the refresh that made this body began (its age: time() - this).",
            [],
            [([], started)],
        )
        yield _gauge(
            "memgov_exporter_refresh_seconds",
            "Seconds the previous refresh took, reading and rendering (0 before the first).",
            [],
            [([], self.previous_seconds)],
        )
        refreshes = CounterMetricFamily(
            "memgov_exporter_refreshes",
            "Refreshes of the served body, this one included, by reason: start, interval, "
            "change (a record added or removed, a watched holder's death).",
            labels=["reason"],
        )
        for reason, count in self.refreshes.items():
            refreshes.add_metric([reason], count)
        yield refreshes

    def _log(self, reading: model.Reading) -> None:
        """Say on stderr why a GPU (or every GPU) or a queue's file could not be read, once per
        distinct reason."""
        problems = [reading.error] if reading.error else []
        problems += [f"GPU {g.device.uuid}: {g.error}" for g in reading.gpus if g.error]
        problems += [f"job queue {problem}" for problem in reading.queues.problems]
        for problem in problems:
            if problem not in self._said and len(self._said) < 1000:
                self._said.add(problem)
                print(f"memgov exporter: {printable(problem)}", file=sys.stderr, flush=True)


def _gauge(
    name: str, doc: str, labels: list[str], rows: list[tuple[list[str], float]]
) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=labels)
    for values, value in rows:
        family.add_metric([label(v) for v in values], value)
    return family


def _gpu_key(reading: model.Reading, gpu: model.Gpu) -> list[str]:
    d = gpu.device
    return [str(d.index), d.uuid, d.name, reading.hostname]


GPU_GAUGES: list[tuple[str, str, Any]] = [
    (
        "memgov_gpu_memory_total_bytes",
        "Device memory (NVML, or MEMGOV_DEVICES).",
        lambda s: s.device.total,
    ),
    (
        "memgov_gpu_memory_used_bytes",
        "Device memory in use by anyone, NVML's figure.",
        lambda s: s.device.used,
    ),
    ("memgov_gpu_claimed_bytes", "Sum of the live claims' budgets.", lambda s: s.claimed),
    (
        "memgov_gpu_free_budget_bytes",
        "Budget a new claim can get now (0 while a live record of unknown size blocks the device).",
        lambda s: s.free,
    ),
    (
        "memgov_gpu_reserve_bytes",
        "Bytes kept out of every budget (MEMGOV_RESERVE).",
        lambda s: s.reserve,
    ),
    (
        "memgov_gpu_outside_bytes",
        "Bytes used on the device outside every claim (NVML).",
        lambda s: s.outside,
    ),
    (
        "memgov_admission_waiting",
        "Claims waiting in the device's admission queue.",
        lambda s: len(s.queue),
    ),
    (
        "memgov_ledger_problem_files",
        "Files in the device's ledger that were skipped: corrupt, "
        "foreign, unreadable or symlinks (`memgov status` names them).",
        lambda s: len(s.problems),
    ),
    (
        "memgov_ledger_unknown_claims",
        "Live records whose size cannot be read; while any exists "
        "no claim is admitted on the device.",
        lambda s: len(s.unknown),
    ),
]


def _gpu_families(reading: model.Reading) -> Iterator[Metric]:
    readable = [g for g in reading.gpus if g.snapshot is not None]
    for name, doc, value in GPU_GAUGES:
        yield _gauge(
            name, doc, GPU_LABELS, [(_gpu_key(reading, g), value(g.snapshot)) for g in readable]
        )
    yield _gauge(
        "memgov_ledger_readable",
        "1 when the device's ledger could be read, else 0 (the exporter's log says why).",
        GPU_LABELS,
        [(_gpu_key(reading, g), 1 if g.snapshot is not None else 0) for g in reading.gpus],
    )
    now_waits = []
    for g in readable:
        assert g.snapshot is not None
        oldest = min((q.created for q in g.snapshot.queue), default=None)
        if oldest is not None:
            now_waits.append((_gpu_key(reading, g), max(0.0, time.time() - oldest)))
    yield _gauge(
        "memgov_admission_oldest_wait_seconds",
        "How long the first claim in the admission queue has waited (absent when none waits).",
        GPU_LABELS,
        now_waits,
    )
    claims = GaugeMetricFamily(
        "memgov_gpu_claims",
        "Live claims, by mode (hard: MPS-enforced).",
        labels=[*GPU_LABELS, "mode"],
    )
    clients = GaugeMetricFamily(
        "memgov_gpu_mps_clients",
        "Hard claims (MPS clients) per memgov MPS daemon, from the ledger.",
        labels=[*GPU_LABELS, "daemon"],
    )
    daemons = GaugeMetricFamily(
        "memgov_gpu_mps_daemons",
        "memgov's MPS control daemons that answer (each serves every GPU).",
        labels=GPU_LABELS,
    )
    for g in readable:
        assert g.snapshot is not None
        key = [label(v) for v in _gpu_key(reading, g)]
        for mode in ("soft", "hard"):
            count = sum(1 for c in g.snapshot.claims if c.mode == mode)
            claims.add_metric([*key, mode], count)
        for daemon, count in sorted(g.snapshot.hard_by_daemon.items()):
            clients.add_metric([*key, str(daemon)], count)
        daemons.add_metric(key, reading.mps_daemons)
    yield from (claims, clients, daemons)


def _claim_families(reading: model.Reading) -> Iterator[Metric]:
    budget = GaugeMetricFamily(
        "memgov_claim_budget_bytes", "The claim's budget.", labels=CLAIM_LABELS
    )
    used = GaugeMetricFamily(
        "memgov_claim_used_bytes",
        "Device memory the holder uses now (NVML; absent where its process cannot be told apart).",
        labels=CLAIM_LABELS,
    )
    threads = GaugeMetricFamily(
        "memgov_claim_threads", "CPU threads the holder was given.", labels=CLAIM_LABELS
    )
    age = GaugeMetricFamily(
        "memgov_claim_age_seconds", "Seconds since the claim was admitted.", labels=CLAIM_LABELS
    )
    for g in reading.gpus:
        for c in g.claims:
            e, h = c.entry, c.holder
            values = [
                label(v)
                for v in (
                    *_gpu_key(reading, g),
                    e.id,
                    e.name,
                    e.pid,
                    h.user,
                    e.mode,
                    e.host,
                    h.container,
                    h.pod,
                    h.pod_uid,
                    "",
                )
            ]
            budget.add_metric(values, e.bytes)
            age.add_metric(values, c.age_s)
            if c.used is not None:
                used.add_metric(values, c.used)
            if c.threads is not None:
                threads.add_metric(values, c.threads)
    yield from (budget, used, threads, age)


def _counter_families(reading: model.Reading) -> Iterator[Metric]:
    labels = [*GPU_LABELS, "user"]
    reclaimed = CounterMetricFamily(
        "memgov_ledger_reclaimed_records",
        "Records of dead holders (claims and queue tickets) removed by admissions and `memgov gc`.",
        labels=labels,
    )
    refused = CounterMetricFamily(
        "memgov_admission_refusals",
        "Claims refused (BudgetExceeded), by reason.",
        labels=[*labels, "reason"],
    )
    waits = HistogramMetricFamily(
        "memgov_admission_wait_seconds",
        "Time a claim that asked to wait spent from its "
        "request to admission (outcome=admitted) or to its refusal (outcome=timeout).",
        labels=[*labels, "outcome"],
    )
    lock_timeouts = CounterMetricFamily(
        "memgov_admission_lock_timeouts",
        "Claims that failed with LockTimeout: the GPU's admission lock stayed held past its "
        "bound (a stopped or hostile holder of the lock).",
        labels=labels,
    )
    for g in reading.gpus:
        for uid, counts in sorted(g.counts.items()):
            key = [label(v) for v in (*_gpu_key(reading, g), user_name(uid))]
            reclaimed.add_metric(key, counts.reclaimed)
            lock_timeouts.add_metric(key, counts.lock_timeouts)
            for reason, n in counts.refused.items():
                refused.add_metric([*key, reason], n)
            for outcome, hist in counts.waits.items():
                waits.add_metric([*key, outcome], _cumulative(hist), sum_value=hist.sum)
    yield from (reclaimed, refused, waits, lock_timeouts)


QUEUE_GAUGES: list[tuple[str, str, Any]] = [
    ("memgov_queue_jobs_queued", "The user's queued jobs (memgov queue): not started.", "queued"),
    (
        "memgov_queue_jobs_waiting",
        "Of the user's queued jobs, those whose arrival has come: ready, waiting for room on a "
        "GPU or for a runner.",
        "waiting",
    ),
    ("memgov_queue_jobs_running", "The user's running queue jobs.", "running"),
]


def _queue_families(reading: model.Reading) -> Iterator[Metric]:
    users = sorted(reading.queues.users.items())
    for name, doc, attribute in QUEUE_GAUGES:
        yield _gauge(
            name,
            doc,
            ["Hostname", "user"],
            [([reading.hostname, user_name(uid)], getattr(q, attribute)) for uid, q in users],
        )
    yield _gauge(
        "memgov_queue_problem_files",
        "Files and folders of the users' job queues that were skipped: not their user's, "
        "symlinks, special, oversized or not memgov's format (the exporter's log names them).",
        ["Hostname"],
        [([reading.hostname], len(reading.queues.problems))],
    )
    owners = GaugeMetricFamily(
        "memgov_admission_waiting_claims",
        "Claims waiting in the device's admission queue, by the user who owns each ticket.",
        labels=[*GPU_LABELS, "user"],
    )
    for g in reading.gpus:
        if g.snapshot is None:
            continue
        by_uid: dict[int | None, int] = {}
        for ticket in g.snapshot.queue:
            by_uid[ticket.uid] = by_uid.get(ticket.uid, 0) + 1
        key = [label(v) for v in _gpu_key(reading, g)]
        for uid, count in sorted(by_uid.items(), key=lambda item: (item[0] is None, item[0] or 0)):
            owners.add_metric([*key, label(user_name(uid))], count)
    yield owners


def _cumulative(hist: _stats.Waits) -> list[tuple[str, float]]:
    bounds = [*(f"{b:g}" for b in _stats.WAIT_BUCKETS), "+Inf"]
    total, rows = 0, []
    for bound, count in zip(bounds, hist.buckets, strict=True):
        total += count
        rows.append((bound, float(total)))
    return rows
