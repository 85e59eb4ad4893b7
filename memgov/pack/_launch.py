"""The launcher of one job of ``memgov pack --runner preload`` (memgov/pack/preload.py).

pack spawns this file as the job's process, in the job's own session, the way it spawns any job:
``python -I -S _launch.py SOCKET PIDFILE -- python train.py ARGS``. It imports nothing but the
standard library (run by path with -S: no site-packages, no memgov, no framework) so that it costs
a bare interpreter. It asks the zygote (memgov/pack/_zygote.py) to fork the job, handing over its
argv, environment, working directory, CPU affinity and its stdin/stdout/stderr descriptors
(SCM_RIGHTS), then stands in for the job towards pack:

- it writes the job's PID into PIDFILE (pack's sampler reads it: NVML and USS figures are the
  forked child's);
- it forwards SIGTERM, SIGINT, SIGHUP, SIGUSR1 and SIGUSR2 to the job's process group;
- it exits with the job's exit status, or dies of the job's signal (re-raised on itself), so pack
  decodes it as it would a plain process;
- if the zygote ends while the job runs (it was killed), the job is killed too (the child also
  has PR_SET_PDEATHSIG against the zygote) and the launcher says so on stderr, exit status 70;
- if the zygote answers ``spawn`` (it cannot fork safely) the launcher execs the job itself.

If this launcher is SIGKILLed, the zygote sees its connection close and SIGKILLs the job.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import socket
import struct
import sys

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
FAILED = 70
"""Exit status when the job could not run because of the preload machinery (EX_SOFTWARE)."""
PREFIX = "memgov pack --runner preload"

_child: list[int] = []


def _forward(signum: int, _frame: object) -> None:
    if _child:
        _signal_job(_child[0], signum)
        return
    # No job yet (the zygote is still importing the framework, or forking): end here, as a plain
    # process that had not yet installed a handler would; the zygote kills a child it forks
    # for a connection that has closed.
    _die_of(signum)


def _signal_job(pid: int, signum: int) -> None:
    """The job's process group; the job alone while it has no group of its own yet (just
    forked: the signal stays pending until it has its handlers, the zygote sees to that)."""
    try:
        os.killpg(pid, signum)
    except ProcessLookupError:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)
    except PermissionError:
        pass


def _die_of(signum: int) -> None:
    for sig in FORWARDED:
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signum, signal.SIG_DFL)
    with contextlib.suppress(ValueError, OSError):  # SIGSEGV/SIGABRT: no core of ours
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signum])
    os.kill(os.getpid(), signum)
    os._exit(128 + signum)  # a signal whose default action is to be ignored


def _fail(message: str) -> None:
    sys.stderr.write(f"{PREFIX}: {message}\n")
    sys.stderr.flush()
    os._exit(FAILED)


def _write_pid(path: str, pid: int) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as out:
        out.write(str(pid))
    os.replace(tmp, path)


def main(argv: list[str]) -> None:
    if len(argv) < 5 or argv[2] != "--":
        _fail("usage: _launch.py SOCKET PIDFILE -- COMMAND...")
    path, pidfile, command = argv[0], argv[1], argv[3:]
    for sig in FORWARDED:
        signal.signal(sig, _forward)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
    except OSError as exc:
        _fail(f"no zygote answers at {path} ({exc.strerror or exc}); the job did not start")
    request = json.dumps(
        {
            "argv": command,
            "env": dict(os.environ),
            "cwd": os.getcwd(),
            "cpus": sorted(os.sched_getaffinity(0)),
            "umask": _umask(),
        }
    ).encode()
    message = struct.pack("!I", len(request)) + request
    try:
        sent = socket.send_fds(conn, [message], [0, 1, 2])
        conn.sendall(message[sent:])
    except OSError as exc:
        _fail(
            f"the zygote at {path} took no request ({exc.strerror or exc}); the job did not start"
        )
    replies = conn.makefile("rb")
    while True:
        try:
            line = replies.readline().decode("utf-8", "replace").strip()
        except OSError:
            line = ""
        word, _, rest = line.partition(" ")
        if word == "pid" and rest.isdigit():
            _child.append(int(rest))
            _write_pid(pidfile, int(rest))
        elif word == "exit" and rest.lstrip("-").isdigit():
            code = os.waitstatus_to_exitcode(int(rest))
            if code < 0:
                _die_of(-code)
            sys.stdout.flush()
            os._exit(code)
        elif word == "spawn":
            # The zygote cannot fork safely (a thread of the framework runs through fork):
            # become the job, exactly as the process runner would have started it.
            sys.stderr.write(f"memgov: preload: {rest}; this job is spawned normally\n")
            sys.stderr.flush()
            for sig in FORWARDED:
                signal.signal(sig, signal.SIG_DFL)
            conn.close()
            try:
                os.execvp(command[0], command)
            except OSError as exc:
                _fail(f"cannot run {command[0]!r}: {exc.strerror or exc}")
        elif word == "error":
            _fail(rest)
        else:  # EOF: the zygote ended (killed) before it reported the job's end
            if _child:
                _signal_job(_child[0], signal.SIGKILL)
                _fail(
                    f"the zygote ended while the job ran (pid {_child[0]}); the job was "
                    "killed with it"
                )
            _fail("the zygote ended before it started the job; the job did not start")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


if __name__ == "__main__":
    main(sys.argv[1:])
