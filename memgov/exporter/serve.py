"""Serving the metrics: /metrics over HTTP, or a file for node_exporter's textfile collector."""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from prometheus_client import CollectorRegistry, generate_latest, start_http_server

from memgov import _records
from memgov._errors import ConfigError, LedgerError
from memgov.exporter import DEFAULT_PORT
from memgov.exporter.families import MemgovCollector

TEXTFILE_NAME = "memgov.prom"
_LISTEN = re.compile(
    r"^(?:\[(?P<v6>[0-9A-Za-z:.%]+)\]|(?P<host>[^:\[\]\s]*)):(?P<port>[0-9]{1,5})$"
)
LISTEN_FORMS = "HOST:PORT, [IPV6]:PORT or :PORT (every interface), with PORT from 1 to 65535"


def parse_listen(text: str) -> tuple[str, int]:
    """(address, port) of a --listen value; ':PORT' and a bare PORT listen on every interface."""
    value = text.strip()
    if value.isdigit():
        value = f":{value}"
    found = _LISTEN.match(value)
    port = int(found.group("port")) if found else 0
    if found is None or not 1 <= port <= 65535:
        raise ConfigError(f"--listen {text!r}: accepted {LISTEN_FORMS}")
    host = found.group("v6") or found.group("host") or "0.0.0.0"
    return host, port


DEFAULT_LISTEN = f":{DEFAULT_PORT}"


def registry() -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(MemgovCollector())
    return reg


def serve(listen: str = DEFAULT_LISTEN, ready: threading.Event | None = None) -> None:
    """Answer /metrics on ``listen`` until SIGTERM or SIGINT; each scrape reads afresh."""
    host, port = parse_listen(listen)
    try:
        server, thread = start_http_server(port, addr=host, registry=registry())
    except OSError as exc:
        raise ConfigError(
            f"--listen {listen!r}: cannot listen on {host}:{port}: {exc.strerror or exc}"
        ) from None
    print(
        f"memgov exporter: serving http://{_show(host)}:{port}/metrics", file=sys.stderr, flush=True
    )
    try:
        _until_stopped(ready)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def write_textfile(folder: Path) -> Path:
    """Write DIR/memgov.prom once, whole or not at all: a temporary file in DIR, fsync, rename;
    DIR itself is never followed through a symlink, nor is any file in it."""
    data = generate_latest(registry())
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(folder, flags)
    except OSError as exc:
        raise LedgerError(
            f"--textfile {str(folder)!r}: cannot open the folder ({exc.strerror}; "
            "accepted: an existing folder, not a symlink)"
        ) from None
    try:
        _records.write_atomic(fd, TEXTFILE_NAME, data, mode=0o644)
    except OSError as exc:
        raise LedgerError(
            f"--textfile {str(folder)!r}: cannot write {TEXTFILE_NAME}: {exc.strerror or exc}"
        ) from None
    finally:
        os.close(fd)
    return folder / TEXTFILE_NAME


def textfile_loop(folder: Path, interval: float, ready: threading.Event | None = None) -> None:
    """Rewrite DIR/memgov.prom every ``interval`` seconds until SIGTERM or SIGINT."""
    stop = threading.Event()
    _on_signals(stop)
    while not stop.is_set():
        write_textfile(folder)
        if ready is not None:
            ready.set()
        stop.wait(interval)


def _until_stopped(ready: threading.Event | None) -> None:
    stop = threading.Event()
    _on_signals(stop)
    if ready is not None:
        ready.set()
    while not stop.wait(3600):
        pass


def _on_signals(stop: threading.Event) -> None:
    if threading.current_thread() is not threading.main_thread():
        return  # embedded (tests): the caller stops it

    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, handler)


def _show(host: str) -> str:
    return f"[{host}]" if ":" in host else host


__all__ = ["DEFAULT_LISTEN", "parse_listen", "registry", "serve", "textfile_loop", "write_textfile"]
