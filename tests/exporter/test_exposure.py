"""Who reaches `memgov exporter`: the loopback interface unless the admin widens it, and no
client can hold a connection (and its thread) longer than REQUEST_S, nor take every thread,
however it trickles its request; other scrapes are answered meanwhile. Real servers, real
sockets, real bytes a second apart."""

from __future__ import annotations

import os
import select
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from memgov.exporter import DEFAULT_PORT
from memgov.exporter.serve import MAX_CONNECTIONS, REQUEST_S

from .conftest import Exporter, free_port

TRICKLE_S = 1.0
"""One byte a second: each byte arrives well within any per-byte socket timeout."""
NEVER_AFTER = 3 * REQUEST_S
"""Bytes (one a second) after which a trickling connection counts as never closed: a loose
multiple of the stated bound, as the test machine is shared."""


def listening_addresses(port: int) -> set[str]:
    """The local addresses (hex, as /proc/net/tcp writes them) listening on ``port``."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                address, hex_port = fields[1].split(":")
                if fields[3] == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                    found.add(address)
    return found


def test_the_default_is_loopback_only_and_widening_is_explicit(
    sim: str, exporter: Callable[..., Exporter]
) -> None:
    if listening_addresses(DEFAULT_PORT):
        pytest.skip(f"port {DEFAULT_PORT} is taken on this host")
    exporter(port=DEFAULT_PORT)  # no --listen at all
    assert listening_addresses(DEFAULT_PORT) == {"0100007F"}  # 127.0.0.1
    bare = free_port()
    exporter(args=("--listen", str(bare)), port=bare)  # a bare port keeps the loopback
    assert listening_addresses(bare) == {"0100007F"}
    wide = free_port()
    exporter(args=("--listen", f":{wide}"), port=wide)  # every interface: said, not defaulted
    assert listening_addresses(wide) == {"00000000"}


class Trickler:
    """A real client that sends a request's bytes one a second and never finishes it."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.sent = 0
        self.closed = threading.Event()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        request = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 1000
        try:
            while not self.stop.is_set() and self.sent < NEVER_AFTER:
                self.sock.send(request[self.sent : self.sent + 1])
                self.sent += 1
                readable, _, _ = select.select([self.sock], [], [], TRICKLE_S)
                if readable and not self.sock.recv(4096):  # the server closed it
                    self.closed.set()
                    return
        except OSError:  # reset or broken pipe: closed by the server too
            self.closed.set()
        finally:
            self.sock.close()


def threads_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def test_a_trickling_client_is_closed_within_the_bound_and_others_are_served(
    sim: str, exporter: Callable[..., Exporter]
) -> None:
    server = exporter()
    port = int(server.url.split(":")[2].split("/")[0])
    slow = Trickler(port)
    served = 0
    while not slow.closed.is_set() and slow.thread.is_alive():
        assert "memgov_exporter_devices_listed" in server.scrape()  # answered meanwhile
        served += 1
        time.sleep(0.5)
    slow.thread.join(timeout=60)
    assert slow.closed.is_set(), f"still open after {slow.sent} bytes, one a second"
    assert slow.sent < NEVER_AFTER
    assert served >= 1


def test_many_trickling_clients_neither_exhaust_threads_nor_keep_scrapes_out(
    sim: str, exporter: Callable[..., Exporter], tmp_path: Path
) -> None:
    server = exporter()
    port = int(server.url.split(":")[2].split("/")[0])
    server.scrape()
    base = threads_of(server.proc.pid)
    slow = [Trickler(port) for _ in range(MAX_CONNECTIONS + 16)]
    try:
        most = 0
        for _ in range(5):
            time.sleep(TRICKLE_S)
            assert "memgov_exporter_devices_listed" in server.scrape()  # a scrape still gets in
            most = max(most, threads_of(server.proc.pid))
        # The refresher and the HTTP thread are in ``base`` already (one scrape's thread ended).
        assert most <= base + MAX_CONNECTIONS + 2, (most, base)
        assert any(t.closed.is_set() for t in slow)  # made room: the longest waiting went
    finally:
        for t in slow:
            t.stop.set()
