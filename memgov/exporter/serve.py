"""Serving the metrics: /metrics over HTTP, or a file for node_exporter's textfile collector.

Over HTTP a scrape sends the body the refresher prepared last (memgov/exporter/refresh.py) and
does nothing else: no ledger read, no NVML query, no rendering. The HTTP server is the standard
library's (http.server, which prometheus_client imports anyway), one thread per connection, each
bounded by a socket timeout so that a client that never finishes its request holds only its own
thread.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType

from prometheus_client import CONTENT_TYPE_LATEST

from memgov import _records
from memgov._errors import ConfigError, LedgerError
from memgov.exporter import DEFAULT_PORT
from memgov.exporter.refresh import Refresher

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


DEFAULT_REFRESH_S = 5.0
"""Seconds between refreshes when nothing changes (a change refreshes at once)."""
SWITCH_INTERVAL_S = 0.0005
"""The interpreter's thread switch interval: how long the refresher, while it runs, may keep the
GIL from a scrape's thread that asks for it (Python's default is 5 ms)."""
CLIENT_TIMEOUT_S = 10.0


class _Handler(BaseHTTPRequestHandler):
    """GET or HEAD of / or /metrics: the latest body (gzip when the client accepts it)."""

    refresher: Refresher
    timeout = CLIENT_TIMEOUT_S
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self._answer(send_body=True)

    def do_HEAD(self) -> None:
        self._answer(send_body=False)

    def _answer(self, send_body: bool) -> None:
        if self.path.split("?", 1)[0] not in ("/", "/metrics"):
            self.send_error(404, "memgov exporter: only /metrics is served")
            return
        body = self.refresher.body
        gzipped = "gzip" in self.headers.get("Accept-Encoding", "")
        data = body.gzipped if gzipped else body.text
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE_LATEST)
        self.send_header("Content-Length", str(len(data)))
        if gzipped:
            self.send_header("Content-Encoding", "gzip")
        self.end_headers()
        if send_body:
            self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        """Scrapes are not logged (one line a scrape would fill the log)."""


def serve(
    listen: str = DEFAULT_LISTEN,
    refresh_s: float = DEFAULT_REFRESH_S,
    ready: threading.Event | None = None,
    release_nvml: bool = False,
) -> None:
    """Answer /metrics on ``listen`` until SIGTERM or SIGINT, from a body refreshed every
    ``refresh_s`` seconds and at each change of the ledger (memgov/exporter/refresh.py);
    ``release_nvml``: shut NVML down after each refresh (less memory between refreshes, an
    nvmlInit in each)."""
    host, port = parse_listen(listen)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    refresher = Refresher(refresh_s, release_nvml=release_nvml)
    handler = type("Handler", (_Handler,), {"refresher": refresher})
    server_class = type("Server", (ThreadingHTTPServer,), {"address_family": _family(host)})
    try:
        server = server_class((host, port), handler)
    except OSError as exc:
        raise ConfigError(
            f"--listen {listen!r}: cannot listen on {host}:{port}: {exc.strerror or exc}"
        ) from None
    refresher.start()
    thread = threading.Thread(target=server.serve_forever, name="memgov-http", daemon=True)
    thread.start()
    print(
        f"memgov exporter: serving http://{_show(host)}:{port}/metrics", file=sys.stderr, flush=True
    )
    try:
        _until_stopped(ready)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
        refresher.stop()


def _family(host: str) -> socket.AddressFamily:
    """IPv6 for an IPv6 address or a name that resolves only to one, else IPv4."""
    if ":" in host:
        return socket.AF_INET6
    try:
        return socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][0]
    except OSError:
        return socket.AF_INET  # binding says what is wrong with the name


def write_textfile(folder: Path, refresher: Refresher | None = None) -> Path:
    """Write DIR/memgov.prom once, whole or not at all: a temporary file in DIR, fsync, rename;
    DIR itself is never followed through a symlink, nor is any file in it. ``refresher``: the
    loop's, which counts the writes as refreshes (one is made for a single write)."""
    if refresher is None:
        refresher = Refresher(0.0)
        refresher.stop()  # closes the pidfds it opened; its body is all a single write needs
    data = refresher.body.text
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


def textfile_loop(
    folder: Path,
    interval: float,
    ready: threading.Event | None = None,
    release_nvml: bool = False,
) -> None:
    """Rewrite DIR/memgov.prom every ``interval`` seconds until SIGTERM or SIGINT."""
    stop = threading.Event()
    _on_signals(stop)
    # Its thread is not started: each write is one refresh.
    refresher = Refresher(interval, release_nvml=release_nvml)
    while not stop.is_set():
        write_textfile(folder, refresher)
        if ready is not None:
            ready.set()
        if not stop.wait(interval):
            refresher.refresh("interval")


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


__all__ = [
    "DEFAULT_LISTEN",
    "DEFAULT_REFRESH_S",
    "parse_listen",
    "serve",
    "textfile_loop",
    "write_textfile",
]
