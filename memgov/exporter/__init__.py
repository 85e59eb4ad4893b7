"""memgov's Prometheus exporter: the ledger and NVML as metrics, beside NVIDIA's dcgm-exporter.

A part of its own, as nvitop ships its exporter apart: ``pip install 'memgov-gpu[exporter]'``
adds prometheus_client, which only this subpackage imports. ``model`` reads what memgov knows
(the ledger through memgov's own readers, NVML, the counters of ``memgov._ledger.stats``) into plain
data and needs no prometheus_client; ``families`` turns one reading into metric families, once per
scrape; ``serve`` answers /metrics over HTTP or writes node_exporter's textfile. docs/metrics.md
lists every metric.
"""

from __future__ import annotations

import os
import sys

from memgov._base.errors import MemgovError

DEFAULT_PORT = 10492
"""Not dcgm-exporter's 9400 nor node_exporter's 9100: the Prometheus project's list of exporter
ports filled 9100-9999 and continues above 10000; docs/metrics.md says how it was chosen."""
DEFAULT_LISTEN = f"127.0.0.1:{DEFAULT_PORT}"
"""The loopback interface only: the metrics name every user's claims, pids and jobs, so serving
them to whoever reaches the host is the admin's explicit choice (``--listen :PORT``)."""
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


SERVING_ENV = {"MALLOC_ARENA_MAX": "1"}
"""Set in the serving process's environment unless the user set them (docs/metrics.md,
"Memory"). glibc gives every thread that allocates an arena of its own (up to 8 per core), each
a 64 MiB reservation whose touched pages stay resident after their blocks are freed; the
exporter's refresher (and NVML inside it), its HTTP thread and each connection's thread would
each keep one. One arena is enough for a process whose threads take turns on the interpreter's
lock. glibc reads the variable once, when malloc starts, before any Python code runs: it can only
be set in the environment of the process that is exec'd, never from inside it."""


def serving_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of the serving process: ``environ`` (this one's) plus SERVING_ENV's
    settings where it has none of its own."""
    env = dict(os.environ if environ is None else environ)
    for name, value in SERVING_ENV.items():
        env.setdefault(name, value)
    return env


def exec_server(listen: str, refresh_s: float, release_nvml: bool = False) -> None:
    """Replace this process (same PID) with the lean serving process, ``python -m
    memgov.exporter``, with this interpreter and its flags (-X, -I...) and
    :func:`serving_environment`; does not return."""
    import subprocess

    flags: list[str] = getattr(subprocess, "_args_from_interpreter_flags", list)()
    argv = [sys.executable, *flags, "-m", "memgov.exporter"]
    argv += ["--listen", listen, "--refresh", repr(refresh_s)]
    argv += ["--release-nvml"] if release_nvml else []
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, argv, serving_environment())


__all__ = [
    "DEFAULT_LISTEN",
    "DEFAULT_PORT",
    "INSTALL",
    "SERVING_ENV",
    "ExporterUnavailable",
    "exec_server",
    "require_prometheus_client",
    "serving_environment",
]
