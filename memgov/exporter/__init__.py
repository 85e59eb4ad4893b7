"""memgov's Prometheus exporter: the ledger and NVML as metrics, beside NVIDIA's dcgm-exporter.

A part of its own, as nvitop ships its exporter apart: ``pip install 'memgov-gpu[exporter]'``
adds prometheus_client, which only this subpackage imports. ``model`` reads what memgov knows
(the ledger through memgov's own readers, NVML, the counters of ``memgov._stats``) into plain
data and needs no prometheus_client; ``families`` turns one reading into metric families, once per
scrape; ``serve`` answers /metrics over HTTP or writes node_exporter's textfile. docs/metrics.md
lists every metric.
"""

from __future__ import annotations

from memgov._errors import MemgovError

DEFAULT_PORT = 10492
"""Not dcgm-exporter's 9400 nor node_exporter's 9100: the Prometheus project's list of exporter
ports filled 9100-9999 and continues above 10000; docs/metrics.md says how it was chosen."""
INSTALL = "pip install 'memgov-gpu[exporter]'"


class ExporterUnavailable(MemgovError):
    """The exporter's optional dependency (prometheus_client) is not installed."""


def require_prometheus_client() -> None:
    """Raise ExporterUnavailable, with the install command, when prometheus_client is missing."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        raise ExporterUnavailable(
            f"the exporter needs prometheus_client, which is not installed: {INSTALL}"
        ) from None


__all__ = ["DEFAULT_PORT", "INSTALL", "ExporterUnavailable", "require_prometheus_client"]
