"""Containers of different users on one ledger: claims, what each can do to the others' records.

    python tests/docker/users_check.py IMAGE LEDGER_BASE [USERNS_DOCKER_HOST]

Starts one holder container (holder.py) per user: root and uids 1001 and 1002 on the default
engine, and root of an engine started with --userns-remap=default when its socket is given.
Each claims 1 GiB on a simulated 8 GiB device through the bind-mounted ledger. The host then
reads `memgov status` (every claim, named by its container's hostname), lets each holder that is
not host root try to alter the others' records, one after the other, checking after each that
every record is still there, unchanged, lets them all exit, and reads the ledger again. Root in
a container without user-namespace remapping is root on the host: it can alter anything, so it
is not asked to (that is what --userns-remap is for). Prints one
JSON object; tests/docker/test_containers.py asserts on it.
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DEVICES = "sim0:8GiB"


def _docker(host: str | None, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if host:
        env["DOCKER_HOST"] = host
    return subprocess.run(
        ["docker", *args], capture_output=True, text=True, timeout=timeout, check=False, env=env
    )


def remapped_root_uid(subuid: str, user: str = "dockremap") -> int:
    """The host uid that root in a --userns-remap=default container runs as: the start of the
    lowest of USER's ranges in /etc/subuid (``name:start:count`` lines), as Docker maps them
    (moby's idtools sorts the ranges and maps container uid 0 to the first)."""
    try:
        uid = str(pwd.getpwnam(user).pw_uid)
    except KeyError:
        uid = None
    starts = []
    for line in subuid.splitlines():
        fields = line.strip().split(":")
        if len(fields) == 3 and fields[0] in (user, uid) and fields[1].isdigit():
            starts.append(int(fields[1]))
    if not starts:
        raise RuntimeError(f"no subordinate uid range for {user} in /etc/subuid: {subuid!r}")
    return min(starts)


def _status(ledger: Path, as_json: bool) -> str:
    env = {**os.environ, "MEMGOV_DIR": str(ledger), "MEMGOV_DEVICES": DEVICES}
    argv = [sys.executable, "-m", "memgov", "status", *(["--json"] if as_json else [])]
    return subprocess.run(
        argv, capture_output=True, text=True, env=env, timeout=60, check=False
    ).stdout


def run(image: str, base: Path, userns_host: str | None) -> dict[str, Any]:
    ledger, stage = base / "ledger", base / "stage"
    for folder in (base, stage):
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(0o1777)  # every container's user must reach them, as on a shared /tmp
    # The admin set-up of a ledger shared by several users (docs/ledger.md): root makes it and
    # runs `memgov gc` once, which creates every device's folders with the modes users need.
    ledger.mkdir(mode=0o755, exist_ok=True)
    env = {**os.environ, "MEMGOV_DIR": str(ledger), "MEMGOV_DEVICES": DEVICES}
    subprocess.run(
        [sys.executable, "-m", "memgov", "gc"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    holders: list[tuple[str, str | None, list[str]]] = [
        ("root", None, []),
        ("uid1001", None, ["--user", "1001:1001"]),
        ("uid1002", None, ["--user", "1002:1002"]),
    ]
    if userns_host:
        holders.append(("userns-root", userns_host, []))
    started = {}
    for name, host, extra in holders:
        container = f"memgov-users-{os.getpid()}-{name}"
        got = _docker(
            host,
            "run",
            "-d",
            "--rm",
            "--init",
            "--network",
            "none",
            "--name",
            container,
            "--hostname",
            container,
            *extra,
            "-v",
            f"{base}:{base}",
            # The ledger mounted at MEMGOV_DIR itself, as docs/ledger.md sets containers up: in
            # a user namespace a folder of an unmapped host user is trusted only as a mount
            # point (inside base, a 1777 folder, any host user could have made it).
            "-v",
            f"{ledger}:{ledger}",
            "-v",
            f"{HERE}:/checks:ro",
            "-e",
            f"MEMGOV_DIR={ledger}",
            "-e",
            f"MEMGOV_DEVICES={DEVICES}",
            "-e",
            "MEMGOV_CLAIM=",
            "--entrypoint",
            "python",
            image,
            "/checks/holder.py",
            name,
            "1GiB",
            str(stage),
        )
        if got.returncode != 0:
            raise RuntimeError(f"docker run {name}: {got.stderr.strip()}")
        started[name] = (container, host)
    out: dict[str, Any] = {"holders": {}}
    try:
        deadline = time.monotonic() + 240
        while not all((stage / f"{n}.claimed").exists() for n in started):
            if time.monotonic() > deadline:
                raise RuntimeError(
                    "holders never claimed: "
                    + "; ".join(_docker(h, "logs", c).stderr[-400:] for c, h in started.values())
                )
            time.sleep(0.2)
        for name in started:
            out["holders"][name] = json.loads((stage / f"{name}.claimed").read_text())
        claims = ledger / "v1" / "sim0" / "claims"
        out["record_owners"] = {p.name: p.stat().st_uid for p in sorted(claims.glob("*.json"))}
        if userns_host:  # dockerd --userns-remap=default made the dockremap user and its ranges
            out["userns_root_uid"] = remapped_root_uid(Path("/etc/subuid").read_text())
        out["status_table"] = _status(ledger, as_json=False)
        out["status"] = json.loads(_status(ledger, as_json=True))
        before = {p.name: p.read_bytes() for p in claims.glob("*.json")}
        out["tamper"], out["records_intact_after"] = {}, {}
        for name in [n for n in started if n != "root"]:
            (stage / f"go-{name}").write_text("")
            while not (stage / f"{name}.tamper").exists():
                if time.monotonic() > deadline + 60:
                    raise RuntimeError(f"holder {name} never reported its tampering")
                time.sleep(0.2)
            out["tamper"][name] = json.loads((stage / f"{name}.tamper").read_text())
            now = {p.name: p.read_bytes() for p in claims.glob("*.json")}
            out["records_intact_after"][name] = now == before
        (stage / "end").write_text("")
        for container, host in started.values():
            _docker(host, "wait", container, timeout=120)
        out["status_after"] = json.loads(_status(ledger, as_json=True))
    finally:
        for container, host in started.values():
            _docker(host, "rm", "-f", container)
    return out


if __name__ == "__main__":
    result = run(sys.argv[1], Path(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else None)
    print(json.dumps(result, indent=1, sort_keys=True))
