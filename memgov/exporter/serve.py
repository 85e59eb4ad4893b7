"""Serving the metrics: /metrics over HTTP, or a file for node_exporter's textfile collector.

Over HTTP a scrape sends the body the refresher prepared last (memgov/exporter/refresh.py) and
does nothing else: no ledger read, no NVML query, no rendering. The HTTP server is the standard
library's (http.server, which prometheus_client imports anyway), one thread per connection. Each
connection gets REQUEST_S for one whole request and its answer (a socket timeout alone restarts
at every byte: a client sending one a second would hold its thread for ever), and at most
MAX_CONNECTIONS are served at once: one more closes the one that has waited longest for its
request, so clients that trickle bytes can neither exhaust the threads nor keep a scrape out.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import re
import signal
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST

from memgov._base.errors import ConfigError, LedgerError
from memgov._files import flock as _flock
from memgov.exporter import DEFAULT_LISTEN, DEFAULT_PORT
from memgov.exporter.refresh import Refresher

TEXTFILE_NAME = "memgov.prom"
_LISTEN = re.compile(
    r"^(?:\[(?P<v6>[0-9A-Za-z:.%]+)\]|(?P<host>[^:\[\]\s]*)):(?P<port>[0-9]{1,5})$"
)
LISTEN_FORMS = (
    "HOST:PORT, [IPV6]:PORT, :PORT (every interface) or PORT (127.0.0.1 only), "
    "with PORT from 1 to 65535"
)
LOOPBACK = "127.0.0.1"


def parse_listen(text: str) -> tuple[str, int]:
    """(address, port) of a --listen value: ':PORT' listens on every interface, a bare PORT on
    the loopback interface only, as the default does (the metrics name every user's claims)."""
    value = text.strip()
    if value.isdigit():
        value = f"{LOOPBACK}:{value}"
    found = _LISTEN.match(value)
    port = int(found.group("port")) if found else 0
    if found is None or not 1 <= port <= 65535:
        raise ConfigError(f"--listen {text!r}: accepted {LISTEN_FORMS}")
    host = found.group("v6") or found.group("host") or "0.0.0.0"
    return host, port


DEFAULT_REFRESH_S = 5.0
"""Seconds between refreshes when nothing changes (a change refreshes at once)."""
SWITCH_INTERVAL_S = 0.0005
"""The interpreter's thread switch interval: how long the refresher, while it runs, may keep the
GIL from a scrape's thread that asks for it (Python's default is 5 ms)."""
REQUEST_S = 10.0
"""How long a connection has for one whole request and its answer, counted from when it may
send it (its accept, or the previous answer's end on a kept-alive connection); then it is
closed. Prometheus's own scrape timeout is 10 s by default."""
MAX_CONNECTIONS = 32
"""Connections served at once, a thread each (the process's threads stay bounded)."""


class _Connection:
    """One accepted connection: since when it waits for its request (None while answered)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.waiting_since: float | None = time.monotonic()
        self.evicted = False


class _Connections:
    """The connections being served, at most MAX_CONNECTIONS."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._open: dict[socket.socket, _Connection] = {}

    def admit(self, sock: socket.socket) -> bool:
        """Take ``sock`` in; when full, close the connection that has waited longest for its
        request to make room (a real client's request comes at once: the one waiting longest
        is the slowest sender). False when every connection is being answered."""
        with self._lock:
            if len(self._open) >= self.limit:
                waiting = [c for c in self._open.values() if c.waiting_since is not None]
                if not waiting:
                    return False
                oldest = min(waiting, key=lambda c: c.waiting_since or 0.0)
                oldest.evicted = True
                del self._open[oldest.sock]
                with contextlib.suppress(OSError):  # wakes its thread, blocked in recv
                    oldest.sock.shutdown(socket.SHUT_RDWR)
            self._open[sock] = _Connection(sock)
            return True

    def get(self, sock: socket.socket) -> _Connection:
        with self._lock:
            return self._open.get(sock) or _Connection(sock)

    def drop(self, sock: socket.socket) -> None:
        with self._lock:
            self._open.pop(sock, None)


class _Bounded(io.RawIOBase):
    """The connection's reading side: every recv waits only for what is left of the request's
    REQUEST_S (a socket timeout alone would restart at each byte)."""

    def __init__(self, handler: _Handler) -> None:
        self.handler = handler

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        handler = self.handler
        left = handler.deadline - time.monotonic()
        if left <= 0 or handler.conn.evicted:
            raise TimeoutError(f"no whole request within {REQUEST_S:g} s")
        handler.connection.settimeout(left)
        got = handler.connection.recv_into(buffer)
        if not got and handler.conn.evicted:
            raise TimeoutError("closed to make room for another connection")
        return got


class _Handler(BaseHTTPRequestHandler):
    """GET or HEAD of / or /metrics: the latest body (gzip when the client accepts it)."""

    refresher: Refresher
    connections: _Connections
    protocol_version = "HTTP/1.1"
    deadline = 0.0
    conn: _Connection

    def setup(self) -> None:
        super().setup()
        self.conn = self.connections.get(self.connection)
        self.rfile.close()  # the socket's own file: replaced by one bounded by the deadline
        self.rfile = io.BufferedReader(_Bounded(self))

    def handle_one_request(self) -> None:
        self.deadline = time.monotonic() + REQUEST_S
        self.conn.waiting_since = time.monotonic()
        super().handle_one_request()

    def parse_request(self) -> bool:
        parsed = super().parse_request()  # the request line was read; this reads the headers
        self.conn.waiting_since = None
        # The answer's send gets what is left of REQUEST_S too (a client that reads nothing).
        self.connection.settimeout(max(self.deadline - time.monotonic(), 0.001))
        return parsed

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


class _Server(ThreadingHTTPServer):
    connections: _Connections

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.connections.admit(request):
            self.shutdown_request(request)  # every slot is sending an answer: closed at once
            return
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        self.connections.drop(request)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away (reset, closed, evicted) is not an error of the server's."""
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


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
    connections = _Connections(MAX_CONNECTIONS)
    handler = type("Handler", (_Handler,), {"refresher": refresher, "connections": connections})
    server_class = type(
        "Server", (_Server,), {"address_family": _family(host), "connections": connections}
    )
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
    """Write DIR/memgov.prom once, whole or not at all: a temporary file in DIR, fsync, rename
    inside the folder's descriptor (:func:`open_folder`: no symlink anywhere on DIR's path is
    followed), nor is any file in it. ``refresher``: the loop's, which counts the writes as
    refreshes (one is made for a single write)."""
    if refresher is None:
        refresher = Refresher(0.0)
        refresher.stop()  # closes the pidfds it opened; its body is all a single write needs
    data = refresher.body.text
    fd = open_folder(folder)
    try:
        _flock.write_atomic(fd, TEXTFILE_NAME, data, mode=0o644)
    except OSError as exc:
        raise LedgerError(
            f"--textfile {str(folder)!r}: cannot write {TEXTFILE_NAME}: {exc.strerror or exc}"
        ) from None
    finally:
        os.close(fd)
    return folder / TEXTFILE_NAME


def open_folder(folder: Path) -> int:
    """A descriptor of folder ``folder``, reached from ``/`` one component at a time, each
    opened relative to the one before with O_NOFOLLOW: a symlink anywhere on the path is
    refused, not followed. Opening only the last component so would still follow a link
    higher up, which the user who owns a folder on the path can plant and re-point at any
    time: root's exporter would then write wherever it leads. ``..`` is resolved by the
    name alone (os.path.abspath), which is exact on a path of real folders."""
    path = Path(os.path.abspath(folder))
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open("/", flags)
    where = Path("/")
    try:
        for part in path.parts[1:]:
            where = where / part
            inner = os.open(part, flags, dir_fd=fd)
            os.close(fd)
            fd = inner
    except OSError as exc:
        os.close(fd)
        why = "a symlink or not a folder" if exc.errno in (errno.ELOOP, errno.ENOTDIR) else None
        raise LedgerError(
            f"--textfile {str(folder)!r}: cannot open {str(where)!r} "
            f"({why or exc.strerror}; accepted: an existing folder whose path from / has no "
            "symlink)"
        ) from None
    return fd


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
    "DEFAULT_PORT",
    "DEFAULT_REFRESH_S",
    "MAX_CONNECTIONS",
    "REQUEST_S",
    "open_folder",
    "parse_listen",
    "serve",
    "textfile_loop",
    "write_textfile",
]
