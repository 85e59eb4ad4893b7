"""Who holds a claim: user, container and pod, from the ledger and, where visible, /proc.

A record names its holder's PID in the holder's own PID namespace and that namespace's inode
(memgov._ledger.ledger). Where the exporter can see that process (the same PID namespace, or the
host's, which sees every process), its cgroup path says which container and Kubernetes pod it runs
in. Where it cannot (the exporter in a pod without ``hostPID``), those labels stay empty, except
``pod`` in Kubernetes (below). Nothing here needs privileges: /proc/PID/cgroup is world-readable.
"""

from __future__ import annotations

import os
import pwd
import re
from dataclasses import dataclass
from functools import cache

from memgov._ledger.attribution import HOST_PIDNS, identity, pidns_of
from memgov._ledger.ledger import Entry

MAX_CGROUP_BYTES = 64 * 1024
_CONTAINER_ID = re.compile(
    r"(?:docker|cri-containerd|crio|libpod|containerd)[-/]([0-9a-f]{64})"
    r"|/([0-9a-f]{64})(?:\.scope)?$"
)
_POD_UID = re.compile(
    r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})"
)


@dataclass(frozen=True)
class Holder:
    user: str
    container: str
    """The container runtime's ID of the holder's container, 12 characters as `docker ps`."""
    pod: str
    pod_uid: str
    host_pid: int | None = None
    """The holder's PID as this process sees it, or None where it cannot be seen (the refresher
    watches it with a pidfd, so that its death starts a refresh at once)."""


@cache
def user_name(uid: int | None) -> str:
    if uid is None:
        return ""
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return str(uid)


_known: dict[tuple[str, str], Holder] = {}
"""A claim's holder does not change for the claim's life: found once, kept while the claim is."""


def forget_all_but(live: set[tuple[str, str]]) -> None:
    """Drop what is known of claims that are gone (called after each scrape)."""
    for key in set(_known) - live:
        _known.pop(key, None)


class HolderFinder:
    """Finds holders for one scrape: the /proc index is built at most once, and only if needed."""

    def __init__(self, in_kubernetes: bool, node_name: str) -> None:
        self.mine = pidns_of()
        self.in_kubernetes = in_kubernetes
        self.node_name = node_name
        self._index: dict[tuple[int | None, int | None], int] | None = None

    def holder(self, entry: Entry) -> Holder:
        key = (entry.record, entry.id)
        found = _known.get(key)
        if found is None:
            found = _known[key] = self._find(entry)
        return found

    def _find(self, entry: Entry) -> Holder:
        pid = self._visible_pid(entry)
        cgroup = _cgroup(pid) if pid is not None else ""
        container, pod_uid = parse_cgroup(cgroup)
        pod = ""
        if pod_uid or (pid is None and self.in_kubernetes and entry.host != self.node_name):
            # Kubernetes names a pod's host after the pod (unless spec.hostname or hostNetwork).
            pod = entry.host
        return Holder(user_name(entry.uid), container, pod, pod_uid, pid)

    def _visible_pid(self, entry: Entry) -> int | None:
        if entry.pidns is None or entry.pidns == self.mine:
            return entry.pid if pidns_of(entry.pid) == (entry.pidns or self.mine) else None
        if self.mine != HOST_PIDNS:
            return None  # another namespace's PIDs mean nothing here
        if self._index is None:
            self._index = _proc_index()
        return self._index.get((entry.pidns, entry.pid))


def _proc_index() -> dict[tuple[int | None, int | None], int]:
    """(PID namespace, PID inside it) -> host PID of every process (from the host's /proc)."""
    index: dict[tuple[int | None, int | None], int] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return index
    for name in names:
        if name.isdigit():
            index[identity(int(name))] = int(name)
    return index


def _cgroup(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cgroup", "rb") as f:
            raw = f.read(MAX_CGROUP_BYTES)
    except OSError:
        return ""
    lines = raw.decode(errors="replace").splitlines()
    unified = [line.split(":", 2)[2] for line in lines if line.startswith("0::")]
    if unified and unified[0] not in ("", "/"):
        return unified[0]
    for line in lines:  # cgroup v1: the memory or pids controller's path names the container
        parts = line.split(":", 2)
        if len(parts) == 3 and ("memory" in parts[1].split(",") or parts[1] == "pids"):
            return parts[2]
    return unified[0] if unified else ""


def parse_cgroup(path: str) -> tuple[str, str]:
    """(container ID, 12 characters; pod UID) named by a cgroup path; "" for what it does not
    name. Docker, containerd, CRI-O and podman, cgroupfs and systemd drivers."""
    container = ""
    for part in reversed(path.split("/")):
        found = _CONTAINER_ID.search("/" + part)
        if found:
            container = (found.group(1) or found.group(2))[:12]
            break
    pod = _POD_UID.search(path)
    return container, pod.group(1).replace("_", "-") if pod else ""
