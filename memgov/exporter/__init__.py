"""memgov's Prometheus exporter: the ledger and NVML as metrics, beside NVIDIA's dcgm-exporter.

A part of its own, as nvitop ships its exporter apart: ``pip install 'memgov-gpu[exporter]'``
adds prometheus_client, which only this subpackage imports. ``model`` reads what memgov knows
(the ledger through memgov's own readers, NVML, the counters of ``memgov._stats``) into plain
data and needs no prometheus_client; ``families`` turns one reading into metric families, once per
scrape; ``serve`` answers /metrics over HTTP or writes node_exporter's textfile. docs/metrics.md
lists every metric.
"""

from __future__ import annotations

import os
import sys

from memgov._errors import MemgovError

DEFAULT_PORT = 10492
"""Not dcgm-exporter's 9400 nor node_exporter's 9100: the Prometheus project's list of exporter
ports filled 9100-9999 and continues above 10000; docs/metrics.md says how it was chosen."""
INSTALL = "pip install 'memgov-gpu[exporter]'"


class ExporterUnavailable(MemgovError):
    """The exporter's optional dependency (prometheus_client) is not installed."""


def require_prometheus_client() -> None:
    """Raise ExporterUnavailable, with the install command, when prometheus_client is missing.
    Looked up, not imported: the serving process that replaces the command imports it."""
    import importlib.util

    try:
        found = importlib.util.find_spec("prometheus_client")
    except (ImportError, ValueError):
        found = None
    if found is None:
        raise ExporterUnavailable(
            f"the exporter needs prometheus_client, which is not installed: {INSTALL}"
        )


def exec_server(listen: str, refresh_s: float) -> None:
    """Replace this process (same PID) with the lean serving process, ``python -m
    memgov.exporter``, with this interpreter and its flags (-X, -I...); does not return."""
    import subprocess

    flags: list[str] = getattr(subprocess, "_args_from_interpreter_flags", list)()
    argv = [sys.executable, *flags, "-m", "memgov.exporter"]
    argv += ["--listen", listen, "--refresh", repr(refresh_s)]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, argv)


__all__ = [
    "DEFAULT_PORT",
    "INSTALL",
    "ExporterUnavailable",
    "exec_server",
    "require_prometheus_client",
]
