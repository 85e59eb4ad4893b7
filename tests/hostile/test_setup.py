"""The ledger's path against another user (docs/ledger.md, "Set-ups"): every folder from / down
belongs to root or to its user, memgov never writes through another user's link, and in a user
namespace the overflow uid is trusted only where no other user can have made the folder."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.helpers import fake_mps_control

from .conftest import User

CLAIM = (
    "import memgov\ntry:\n with memgov.claim('{size}'): out('admitted')\n"
    "except memgov.MemgovError as e: out(str(e))"
)


def memgov_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "memgov", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture
def fake_mps(base: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    program = fake_mps_control.install(base / "bin")
    monkeypatch.setenv("PATH", f"{program.parent}{os.pathsep}{os.environ['PATH']}")
    return program


@pytest.mark.parametrize("ledger_mode", [0o1777, 0o755])
def test_root_never_writes_through_another_users_link_in_the_mps_folder(
    users: dict[str, User], base: Path, fake_mps: Path, ledger_mode: int
) -> None:
    b = users["mgl_b"]
    ledger = base / "ledger"
    ledger.mkdir()
    os.chmod(ledger, 0o1777)  # the set-up older error messages advised
    victim = base / "roots-file"
    victim.write_text("precious\n")
    b.run(
        f"import os\nos.makedirs({str(ledger / 'mps' / 'log')!r})\n"
        f"os.symlink({str(victim)!r}, {str(ledger / 'mps' / 'log' / 'start.out')!r})\n"
        f"os.symlink({str(victim)!r}, {str(ledger / 'mps' / 'state.json')!r})\nout(1)"
    )
    os.chmod(ledger, ledger_mode)  # an admin who fixed the mode later: mps/ stays b's
    result = memgov_cli("mps", "start")
    try:
        assert victim.read_text() == "precious\n", result.stderr
        assert result.returncode != 0 and "Traceback" not in result.stderr
        expected = "writable by others" if ledger_mode == 0o1777 else f"belongs to uid {b.uid}"
        assert expected in result.stderr, result.stderr
    finally:
        memgov_cli("mps", "stop", "--force")


def test_mps_start_in_the_admin_set_up_writes_only_its_own_files(
    users: dict[str, User], base: Path, fake_mps: Path
) -> None:
    assert memgov_cli("gc").returncode == 0  # root's set-up: the ledger is root's, 0755
    ledger = base / "ledger"
    got = users["mgl_b"].run(
        f"import os\ntry:\n os.mkdir({str(ledger / 'mps')!r}); out('made')\n"
        "except OSError as e: out(e.errno)"
    )
    assert got == 13  # no user can make mps/ before root
    result = memgov_cli("mps", "start")
    try:
        assert result.returncode == 0, result.stderr
        for path in (ledger / "mps", ledger / "mps" / "log", ledger / "mps" / "state.json"):
            info = os.lstat(path)
            assert info.st_uid == 0 and not info.st_mode & 0o022
    finally:
        assert memgov_cli("mps", "stop", "--force").returncode == 0


def test_a_folder_above_the_ledger_owned_by_another_user_is_refused(
    users: dict[str, User], base: Path
) -> None:
    a, b = users["mgl_a"], users["mgl_b"]
    ledger = base / "jobs" / "ledger"
    env = {"MEMGOV_DIR": str(ledger)}
    b.run(f"import os\nos.mkdir({str(base / 'jobs')!r})\nout(1)")  # b ran memgov first
    gc = memgov_cli("gc", env=env)
    assert gc.returncode != 0 and "Traceback" not in gc.stderr
    assert f"{base / 'jobs'} belongs to uid {b.uid}" in gc.stderr, gc.stderr
    got = a.run(CLAIM.format(size="48GiB"), env=env)
    assert f"belongs to uid {b.uid}" in got and "install -d -m 0755 -o root" in got
    assert not ledger.exists()


def test_a_symlink_above_the_ledger_is_followed_only_when_root_or_you_own_it(
    users: dict[str, User], base: Path
) -> None:
    a, b = users["mgl_a"], users["mgl_b"]
    real = base / "real"
    real.mkdir(mode=0o755)
    b.run(f"import os\nos.symlink({str(real)!r}, {str(base / 'bs-link')!r})\nout(1)")
    got = a.run(CLAIM.format(size="1GiB"), env={"MEMGOV_DIR": str(base / "bs-link" / "ledger")})
    assert f"symlink {base / 'bs-link'} belongs to uid {b.uid}" in got, got
    assert not (real / "ledger").exists()
    os.symlink(real, base / "roots-link")
    env = {"MEMGOV_DIR": str(base / "roots-link" / "ledger")}
    assert memgov_cli("gc", env=env).returncode == 0
    assert a.run(CLAIM.format(size="1GiB"), env=env) == "admitted"
    assert (real / "ledger" / "v1" / "sim0" / "claims").is_dir()


def test_v1_made_first_in_a_world_writable_ledger_is_refused_with_the_one_set_up(
    users: dict[str, User], base: Path
) -> None:
    a, b = users["mgl_a"], users["mgl_b"]
    ledger = base / "ledger"
    ledger.mkdir()
    os.chmod(ledger, 0o1777)  # as older error messages advised
    b.run(f"import os\nos.mkdir({str(ledger / 'v1')!r})\nout(1)")
    for message in (a.run(CLAIM.format(size="1GiB")), memgov_cli("gc").stderr):
        assert "is writable by others (mode 1777)" in message, message
        assert f"sudo chmod 0755 {ledger}" in message and "-m 1777" not in message
    os.chmod(ledger, 0o755)  # the advice
    refused = memgov_cli("gc")
    assert refused.returncode != 0 and f"belongs to uid {b.uid}" in refused.stderr
    shutil.rmtree(ledger / "v1")
    assert memgov_cli("gc").returncode == 0
    assert a.run(CLAIM.format(size="1GiB")) == "admitted"


USERNS = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
uid, gid = os.getuid(), os.getgid()
libc.prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE: setuid() made /proc/self root's
if libc.unshare(0x10000000 | (0x00020000 if BIND else 0)) != 0:  # CLONE_NEWUSER (| CLONE_NEWNS)
    raise OSError(ctypes.get_errno(), 'unshare')
open('/proc/self/setgroups', 'w').write('deny')
open('/proc/self/uid_map', 'w').write(f'0 {uid} 1')
open('/proc/self/gid_map', 'w').write(f'0 {gid} 1')
if BIND and libc.mount(BIND.encode(), BIND.encode(), None, 4096, None) != 0:  # MS_BIND
    raise OSError(ctypes.get_errno(), 'mount --bind')
"""


def in_user_namespace(
    user: User, code: str, env: dict[str, str], bind: Path | None = None
) -> object:
    """Run CODE (see actor.py) as USER inside a user namespace of its own that maps only USER
    (as `unshare -r` and rootless containers do); with BIND, a folder bind-mounted onto itself
    there first (as a container engine mounts the host's ledger)."""
    setup = f"BIND = {str(bind) if bind else ''!r}\n" + USERNS
    return user.run(setup + code, env=env)


def test_in_a_user_namespace_another_users_folder_is_not_taken_for_roots(
    users: dict[str, User], base: Path
) -> None:
    a, b = users["mgl_a"], users["mgl_b"]
    ledger = base / "ledger"
    env = {"MEMGOV_DIR": str(ledger), "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    assert b.run(CLAIM.format(size="1GiB")) == "admitted"  # b's claim made b's ledger
    got = in_user_namespace(a, CLAIM.format(size="1GiB"), env)
    assert isinstance(got, str) and "belongs to uid" in got and "user namespace" in got, got


def test_in_a_user_namespace_roots_ledger_mounted_in_is_trusted(
    users: dict[str, User], base: Path
) -> None:
    # Root's ledger right in /tmp (in the namespace /tmp shows as the overflow uid too, but only
    # root can have made it: it lies in /, which no one else may write), bind-mounted in as a
    # container engine would.
    ledger = Path(tempfile.mkdtemp(prefix="memgov-userns-", dir="/tmp"))
    try:
        ledger.chmod(0o755)
        env = {"MEMGOV_DIR": str(ledger), "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
        assert memgov_cli("gc", env=env).returncode == 0
        got = in_user_namespace(users["mgl_a"], CLAIM.format(size="1GiB"), env, bind=ledger)
        assert got == "admitted", got
        unmounted = in_user_namespace(users["mgl_a"], CLAIM.format(size="1GiB"), env)
        assert "user namespace" in str(unmounted), unmounted  # /tmp is open to all: refused
    finally:
        shutil.rmtree(ledger, ignore_errors=True)
