"""A stand-in for ``nvidia-cuda-mps-control`` on machines without an NVIDIA driver (tests only).

It speaks the same interface memgov uses, and nothing more: ``-d`` starts a background daemon
that listens on ``$CUDA_MPS_PIPE_DIRECTORY/control`` (a UNIX socket, as recent drivers use),
writes ``nvidia-cuda-mps-control.pid`` there and names its process ``nvidia-cuda-mps-control``;
without ``-d`` it sends one command read from stdin to that daemon and prints the answer.
Commands: ``get_server_list`` (the daemon's own PID as its "server" once
``$CUDA_MPS_PIPE_DIRECTORY/fake-clients`` exists, else nothing), ``get_client_list PID`` (that
file's PIDs), ``quit``; and, for tests only, ``spawn_child UID`` (a child process of the daemon
that runs as UID, as a real daemon's servers run as their clients' user). It runs no GPU work:
it exercises memgov's bookkeeping of daemons, not
MPS itself. Each daemon appends one line per start to ``$CUDA_MPS_LOG_DIRECTORY/fake.log``.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import socket
import subprocess
import sys
import time
from pathlib import Path


def install(bin_dir: Path) -> Path:
    """Make ``bin_dir`` with an ``nvidia-cuda-mps-control`` in it that runs this stand-in; a
    test puts ``bin_dir`` first on PATH to use it. Returns the program's path."""
    bin_dir.mkdir()
    program = bin_dir / "nvidia-cuda-mps-control"
    here = str(Path(__file__).resolve())
    program.write_text(
        f"#!{sys.executable}\nimport runpy\nrunpy.run_path({here!r}, run_name='__main__')\n"
    )
    program.chmod(0o755)
    return program


def pipe_dir() -> Path:
    return Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps")


def serve() -> None:
    with contextlib.suppress(OSError):  # the name memgov checks before it signals a PID
        ctypes.CDLL(None).prctl(15, b"nvidia-cuda-mps-control", 0, 0, 0)
    pipe = pipe_dir()
    endpoint = pipe / "control"
    with contextlib.suppress(FileNotFoundError):
        endpoint.unlink()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(endpoint))
    listener.listen(64)
    (pipe / "nvidia-cuda-mps-control.pid").write_text(f"{os.getpid()}\n")
    log = Path(os.environ.get("CUDA_MPS_LOG_DIRECTORY") or pipe)
    with open(log / "fake.log", "a") as f:
        f.write(f"started {os.getpid()} {time.time()}\n")
    clients = pipe / "fake-clients"
    while True:
        conn, _ = listener.accept()
        with conn:
            command = conn.recv(4096).decode().strip()
            if command == "get_server_list":
                answer = f"{os.getpid()}\n" if clients.exists() else ""
            elif command.startswith("get_client_list"):
                answer = clients.read_text() if clients.exists() else ""
            elif command.startswith("spawn_child"):  # tests only: a "server" as user UID
                uid = int(command.split()[1])
                code = f"import os, time; os.setgid({uid}); os.setuid({uid}); time.sleep(120)"
                child = subprocess.Popen([sys.executable, "-c", code])
                answer = f"{child.pid}\n"
            elif command == "quit":
                conn.sendall(b"")
                endpoint.unlink()
                (pipe / "nvidia-cuda-mps-control.pid").unlink()
                return
            else:
                answer = f"unknown command {command}\n"
            conn.sendall(answer.encode())


def ask() -> int:
    command = sys.stdin.read().strip()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(5)
            s.connect(str(pipe_dir() / "control"))
            s.sendall(command.encode())
            s.shutdown(socket.SHUT_WR)
            chunks = []
            while chunk := s.recv(4096):
                chunks.append(chunk)
    except OSError:
        print("Cannot find MPS control daemon process")
        return 1
    sys.stdout.write(b"".join(chunks).decode())
    return 0


def main() -> int:
    if sys.argv[1:2] == ["--serve"]:
        serve()
        return 0
    if sys.argv[1:2] == ["-d"]:
        child = subprocess.Popen(
            [sys.executable, __file__, "--serve"],
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            close_fds=True,
        )
        deadline = time.monotonic() + 10
        while not (pipe_dir() / "nvidia-cuda-mps-control.pid").exists():
            if child.poll() is not None or time.monotonic() > deadline:
                print("fake daemon did not start")
                return 1
            time.sleep(0.02)
        return 0
    return ask()


if __name__ == "__main__":
    sys.exit(main())
