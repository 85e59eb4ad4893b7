"""Talking to an NVIDIA MPS control daemon: where it is, whether it answers, who its clients are.

Everything goes through ``nvidia-cuda-mps-control``, one command per invocation on stdin (NVIDIA
MPS docs, "Tools and Interface Reference"): ``get_server_list``, ``get_client_list <server pid>``,
``quit``. The daemon writes ``nvidia-cuda-mps-control.pid`` into its pipe folder. This module is
what claim() needs (see _enforce); _mps starts and stops memgov's own daemons.

memgov may run several control daemons (each with its own server) for the same GPUs: one server
admits only so many clients per GPU (48 on the H200), and a second daemon with its own pipe
folder admits its own (measured: 96 of 100 clients started with two). Daemon 0 keeps the folders
``$MEMGOV_DIR/mps/pipe`` and ``log``; daemon k >= 1 uses ``pipe-k`` and ``log-k``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from memgov._base import config as _config, settings as _settings
from memgov._base.errors import MpsError

CONTROL = "nvidia-cuda-mps-control"
SERVER = "nvidia-cuda-mps-server"
MPS_PREFIX = "nvidia-cuda-mps"
"""What the kernel keeps of either name (process names are cut to 15 characters)."""
DEFAULT_PIPE = Path("/tmp/nvidia-mps")
"""Where CUDA looks for a daemon when CUDA_MPS_PIPE_DIRECTORY is unset."""
PID_FILE = "nvidia-cuda-mps-control.pid"
QUERY_TIMEOUT_S = 5.0
"""A control command that takes longer means no daemon reads the pipe (a stale FIFO)."""
PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
LOG_ENV = "CUDA_MPS_LOG_DIRECTORY"
MAX_DAEMONS = 16
"""memgov's daemons per host at most (pipe folders looked for on every claim; lstat each)."""
DEFAULT_CLIENTS = _settings.DEFAULT_MPS_CLIENTS
POLICIES = _settings.MPS_POLICIES


@dataclass(frozen=True)
class Paths:
    root: Path
    pipe: Path
    log: Path
    state: Path
    lock: Path


def paths(daemon: int = 0) -> Paths:
    """The folders of memgov's daemon number ``daemon`` (0 to MAX_DAEMONS - 1)."""
    if not 0 <= daemon < MAX_DAEMONS:
        raise MpsError(f"MPS daemon {daemon}: accepted 0 to {MAX_DAEMONS - 1}")
    root = _config.ledger_dir() / "mps"
    tail = "" if daemon == 0 else f"-{daemon}"
    state = "state.json" if daemon == 0 else f"state-{daemon}.json"
    return Paths(root, root / f"pipe{tail}", root / f"log{tail}", root / state, root / "mps.lock")


def daemon_index(pipe: Path) -> int | None:
    """Which of memgov's daemons ``pipe`` belongs to, or None for anyone else's."""
    root = _config.ledger_dir() / "mps"
    if pipe.parent != root:
        return None
    return next((k for k in range(MAX_DAEMONS) if paths(k).pipe == pipe), None)


def running_daemons() -> list[int]:
    """memgov's daemons that answer now, by number (cheap: an lstat and a PID check each)."""
    return [k for k in range(MAX_DAEMONS) if reachable(paths(k).pipe)]


def binary() -> str | None:
    return shutil.which(CONTROL)


def require_binary() -> str:
    found = binary()
    if found is None:
        raise MpsError(
            f"{CONTROL} is not on PATH; it ships with the NVIDIA driver's compute utilities "
            "(Debian/Ubuntu: nvidia-compute-utils-<version>), on the GPU host, not in pip. "
            "Without it claims stay soft (framework caps only)"
        )
    return found


# -- talking to a daemon -----------------------------------------------------------------------
def query(command: str, pipe: Path, timeout: float = QUERY_TIMEOUT_S) -> str | None:
    """The daemon's answer to one control command, or None when no daemon answers on ``pipe``."""
    program = binary()
    if program is None or not is_endpoint(pipe / "control"):
        return None
    env = {**os.environ, PIPE_ENV: str(pipe)}
    if pipe == paths().pipe:
        env[LOG_ENV] = str(paths().log)
    try:
        done = subprocess.run(
            [program],
            input=command + "\n",
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            check=False,
        )
    except (subprocess.TimeoutExpired, OSError):
        return None
    text = done.stdout + done.stderr
    if done.returncode != 0 or "cannot find mps control daemon" in text.lower():
        return None
    return done.stdout


def reachable(pipe: Path) -> bool:
    # Cheap first: claims ask this on their hot path, and 25 jobs starting at once queue up on the
    # control daemon (a 5 s query timed out there on the H200). The endpoint plus a live daemon
    # process is proof enough; only where the daemon's PID cannot be seen is it asked.
    if not is_endpoint(pipe / "control"):
        return False
    return _daemon_alive(pipe) or query("get_server_list", pipe) is not None


def _daemon_alive(pipe: Path) -> bool:
    """The daemon's PID file names a live (not zombie) process whose name is an MPS daemon's.
    Read from /proc/PID/stat rather than through psutil: the exporter asks this at every refresh,
    and importing psutil only for it cost 1.5 MiB of its memory (docs/metrics.md, "Memory")."""
    try:
        pid = int((pipe / PID_FILE).read_text().strip())
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read(4096).decode(errors="replace")
    except (OSError, ValueError):
        return False
    name, _, rest = stat.partition(" (")[2].rpartition(") ")
    return rest[:1] != "Z" and name.startswith(MPS_PREFIX)


def server_pids(pipe: Path) -> list[int]:
    return pids(query("get_server_list", pipe))


def client_pids(pipe: Path, server: int) -> list[int]:
    return pids(query(f"get_client_list {server}", pipe))


def client_daemons() -> list[tuple[int | None, Path]]:
    """The daemons this process's claim may use: (memgov's number or None, pipe folder).

    CUDA_MPS_PIPE_DIRECTORY naming someone else's daemon is the only place CUDA looks. Naming
    one of memgov's (set by a parent's claim or by pack), or unset: memgov's running daemons, and
    the claim picks one with room (claim() then points CUDA at it). With none of memgov's, the
    system default, which CUDA finds by itself.
    """
    raw = os.environ.get(PIPE_ENV, "").strip()
    if raw:
        pipe = Path(raw)
        if daemon_index(pipe) is None:
            return [(None, pipe)] if reachable(pipe) else []
    ours: list[tuple[int | None, Path]] = [(k, paths(k).pipe) for k in running_daemons()]
    if ours or raw:
        return ours
    return [(None, DEFAULT_PIPE)] if reachable(DEFAULT_PIPE) else []


def client_pipe() -> tuple[Path | None, bool]:
    """The first pipe folder of :func:`client_daemons`, and whether it is memgov's."""
    found = client_daemons()
    if not found:
        return None, False
    index, pipe = found[0]
    return pipe, index is not None


def server_uids(pipe: Path) -> dict[int, int | None]:
    """Server PID -> the user it runs as (None where this process cannot see it)."""
    import psutil

    found: dict[int, int | None] = {}
    for pid in server_pids(pipe):
        try:
            found[pid] = psutil.Process(pid).uids().real
        except (psutil.Error, OSError):
            found[pid] = None
    return found


def servers_all_ours(pipes: list[Path]) -> bool:
    """True when no MPS server of another user can be on ``pipes``, known without asking the
    control daemons.

    The control daemon answers one command at a time and is busy while it starts a server: 25
    claims starting together, each asking it for its server list, held every governed job until
    ~19.5 s after launch on the H200 (hand-tuned jobs began from 9.3 s). Known here when:
    /proc shows every user's processes (no hidepid); each daemon is a live process of this PID
    namespace that owns its PID file, started before writing it, with this pipe folder in its
    environment (not a stale or reused PID); every process under each daemon (its servers)
    runs as this user, whatever its name; and no process anywhere with MPS's name runs as
    another user. Anything unknown or unreadable answers False, and the caller asks the daemons
    as before."""
    if not pipes or _proc_hides_others():
        return False
    me = os.getuid()
    try:
        daemons = []
        for pipe in pipes:
            pid_file = pipe / PID_FILE
            info = pid_file.stat()
            pid = int(pid_file.read_text().strip())
            name, fields = _stat(pid)
            if (
                not name.startswith(MPS_PREFIX)
                or _real_uid(pid) != info.st_uid
                or _started_at(fields) > info.st_mtime + 1.0
                or _environ(pid).get(PIPE_ENV) != str(pipe)
            ):
                return False
            daemons.append(pid)
        # One pass over the process table (this runs on the claim path, 25 claims at once):
        # each process's name and parent from its stat file, then the user of those that
        # matter only, the MPS-named ones and those under the daemons.
        table = _process_table()
    except (OSError, ValueError, IndexError):
        return False
    parent = {pid: ppid for pid, (_, ppid) in table.items()}
    for pid, (name, _) in table.items():
        mps_named = name.startswith(MPS_PREFIX) and _full_name(pid, name) != CONTROL
        if not (mps_named or _under(pid, daemons, parent)):
            continue
        uid = _real_uid(pid)
        if uid is not None and uid != me:
            return False  # a server (or a process named like one) of another user
    return True


def _process_table() -> dict[int, tuple[str, int]]:
    """PID -> (name as the kernel keeps it, at most 15 characters; parent PID), from
    /proc/PID/stat: one read per process (psutil reads two and builds an object each: 60 ms of
    a claim's CPU among 25 starting jobs on the H200, and its import). A process gone since the
    listing is left out."""
    table: dict[int, tuple[str, int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            name, fields = _stat(int(entry))
            table[int(entry)] = (name, int(fields[1]))
        except (OSError, ValueError, IndexError):
            continue
    return table


def _stat(pid: int) -> tuple[str, list[str]]:
    """A process's name and the fields of /proc/PID/stat after it (the third field on)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read(4096).decode(errors="replace")
    name, _, rest = stat.partition(" (")[2].rpartition(") ")
    return name, rest.split()


def _started_at(fields: list[str]) -> float:
    """When a process started (seconds since the epoch): its start time in clock ticks since
    boot (stat's 22nd field) after the boot time /proc/stat gives."""
    with open("/proc/stat", "rb") as f:
        boot = next((int(line.split()[1]) for line in f if line.startswith(b"btime ")), None)
    if boot is None:
        raise ValueError("/proc/stat gives no boot time")
    return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")


def _environ(pid: int) -> dict[str, str]:
    """A process's environment as it started (its owner or root can read it)."""
    with open(f"/proc/{pid}/environ", "rb") as f:
        pairs = f.read().decode(errors="replace").split("\0")
    return dict(pair.split("=", 1) for pair in pairs if "=" in pair)


def _full_name(pid: int, name: str) -> str:
    """A name the kernel cut at 15 characters, completed from the command line as psutil does
    (the base name of its first word, when that starts with the cut name)."""
    if len(name) < 15:
        return name
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            first = f.read(4096).split(b"\0", 1)[0].decode(errors="replace")
    except OSError:
        return name
    base = os.path.basename(first)
    return base if base.startswith(name) else name


def _real_uid(pid: int) -> int | None:
    """The real user of a process (its status file's first Uid); None: it has gone since the
    listing (hidepid, which would hide it, was ruled out first)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _under(pid: int, ancestors: list[int], parent: Mapping[int, int | None]) -> bool:
    """Whether ``pid`` descends from one of ``ancestors`` (by the ppid links in ``parent``)."""
    seen: set[int] = set()
    up = parent.get(pid)
    while up is not None and up not in seen and up > 0:
        if up in ancestors:
            return True
        seen.add(up)
        up = parent.get(up)
    return False


def _proc_hides_others() -> bool:
    """Whether /proc may hide other users' processes from this one (mount option hidepid;
    root too: without CAP_SYS_PTRACE, as in a container, it does not see through it)."""
    try:
        with open("/proc/self/mountinfo") as f:
            return hidepid(f.read())
    except OSError:
        return True


def hidepid(mountinfo: str) -> bool:
    """Whether any procfs mounted on /proc in this mountinfo text has hidepid set (other than
    0/off): when procfs is mounted again over /proc, the last line is the one in effect, and
    any of them hiding is reason enough not to trust a process listing."""
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields, super_fields = left.split(), right.split()
        if len(fields) <= 4 or fields[4] != "/proc" or len(super_fields) <= 2:
            continue
        if any(
            o.startswith("hidepid=") and o.split("=", 1)[1] not in ("0", "off")
            for o in super_fields[2].split(",")
        ):
            return True
    return False


def client_limit() -> int:
    """Clients one MPS server (one daemon) admits per GPU: MEMGOV_MPS_CLIENTS, default 48."""
    limit: int = _settings.get("MEMGOV_MPS_CLIENTS")
    return limit


def policy() -> str:
    """Which daemon a hard claim joins (MEMGOV_MPS_POLICY): ``fill`` the lowest-numbered one
    with room (default: the fewest servers busy), or ``spread`` the one with the fewest clients."""
    chosen: str = _settings.get("MEMGOV_MPS_POLICY")
    return chosen


def daemons_for(clients: int) -> int:
    """How many daemons ``clients`` MPS clients on one GPU need at once."""
    limit = client_limit()
    return max(1, -(-clients // limit))


def daemon_pid(pipe: Path) -> int | None:
    try:
        return int((pipe / PID_FILE).read_text().strip())
    except (OSError, ValueError):
        pass
    import psutil  # older drivers write no PID file: find the daemon serving this pipe

    for proc in psutil.process_iter(["name"]):
        if not str(proc.info["name"] or "").startswith(MPS_PREFIX):
            continue
        with contextlib.suppress(psutil.Error):
            if proc.environ().get(PIPE_ENV) == str(pipe):
                return proc.pid
    return None


def is_endpoint(path: Path) -> bool:
    """A UNIX socket (recent drivers) or a FIFO (older ones): the daemon's control endpoint."""
    import stat

    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return False
    return stat.S_ISSOCK(mode) or stat.S_ISFIFO(mode)


def pids(text: str | None) -> list[int]:
    return [int(t) for t in (text or "").split() if t.isdigit()]
