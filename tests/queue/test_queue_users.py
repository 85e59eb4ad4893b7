"""Two real users of one host, each with a queue, sharing the GPUs through the ledger: neither
can see, cancel or alter the other's jobs (memgov/queue/store.py).

Users are made as tests/hostile makes them (root, useradd; ``--host-changes``). Each user runs
``memgov queue`` commands in a process of its own uid; the interpreter is the system's
/usr/bin/python3 of the test's version (the test's may live under /root, which users cannot
enter), with memgov and its dependencies on PYTHONPATH.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import memgov.queue as q
from memgov.queue.queuefile import job_spec
from memgov.queue.store import Store
from tests.helpers.queuejobs import ROOT, memgov_cli
from tests.hostile.conftest import User, base, shared, users  # noqa: F401  (fixtures)

pytestmark = [
    pytest.mark.host_changes("creates users mgl_a and mgl_b (useradd), removed after"),
    pytest.mark.skipif(os.geteuid() != 0, reason="creates users: needs root"),
]
SYSTEM_PYTHON = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"
DEVICES = "sim0:64GiB"


def as_user(user: User, folder: Path, *args: str, timeout: float = 300) -> Any:
    """`memgov ARGS` as ``user`` in ``folder``; (exit status, stdout, stderr)."""
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip(f"needs {SYSTEM_PYTHON} (an interpreter other users may run)")
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(folder),
        "PYTHONPATH": os.pathsep.join([str(ROOT), sysconfig.get_paths()["purelib"]]),
        "MEMGOV_DIR": os.environ["MEMGOV_DIR"],
        "MEMGOV_DEVICES": DEVICES,
    }
    result = subprocess.run(
        [SYSTEM_PYTHON, "-m", "memgov", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=folder,
        timeout=timeout,
        user=user.uid,
        group=user.uid,
        extra_groups=[],
    )
    return result.returncode, result.stdout, result.stderr


def claimer(seconds: float) -> list[str]:
    """A job that claims its MEMGOV_CLAIM on its MEMGOV_DEVICE in the shared ledger, holds it."""
    code = (
        "import os, time, memgov\n"
        "c = memgov.claim(int(os.environ['MEMGOV_CLAIM']), device=os.environ['MEMGOV_DEVICE'],"
        " wait=300)\n"
        f"time.sleep({seconds})\n"
        "print('held', c.bytes)\n"
    )
    return ["python3", "-c", code]


def home(base_folder: Path, user: User) -> Path:
    folder = base_folder / user.name
    folder.mkdir()
    shutil.chown(folder, user.uid, user.uid)
    return folder


def test_two_users_queues_are_private_and_share_the_gpu_through_the_ledger(
    users: dict[str, User],  # noqa: F811
    shared: Path,  # noqa: F811
    base: Path,  # noqa: F811
) -> None:
    a, b = users["mgl_a"], users["mgl_b"]
    where = {u.name: home(base, u) for u in (a, b)}
    for user in (a, b):
        for _ in range(3):  # 3 x 30 GiB each: at most two of the six fit the 64 GiB GPU at once
            code, out, err = as_user(
                user,
                where[user.name],
                "queue",
                "add",
                "--json",
                "--claim",
                "30GiB",
                "--",
                *claimer(0.5),
            )
            assert code == 0, err
    _, listed_a, _ = as_user(a, where["mgl_a"], "queue", "--json")
    ids_a = [j["id"] for j in json.loads(listed_a)["jobs"]]
    _, listed_b, _ = as_user(b, where["mgl_b"], "queue", "--json")
    assert len(ids_a) == 3 and len(json.loads(listed_b)["jobs"]) == 3  # each sees only its own

    # b can neither cancel a's job (ids are per user: b's job of the same id is b's own), nor
    # read or write a's store.
    store_a = shared / "v1" / "_queue" / str(a.uid)
    assert store_a.stat().st_uid == a.uid and store_a.stat().st_mode & 0o777 == 0o700
    peek = subprocess.run(
        [SYSTEM_PYTHON, "-c", f"import os; print(os.listdir({str(store_a / 'jobs')!r}))"],
        capture_output=True,
        text=True,
        user=b.uid,
        group=b.uid,
        extra_groups=[],
        timeout=60,
    )
    assert peek.returncode != 0 and "PermissionError" in peek.stderr
    code, out, err = as_user(b, where["mgl_b"], "queue", "cancel", "99")
    assert code == 2 and "no job 99 in your queue" in err
    code, out, err = as_user(b, where["mgl_b"], "queue", "log", str(ids_a[0]))
    assert code == 0 and "mgl_a" not in out  # b's own (empty) log of b's job, never a's

    results: dict[str, Any] = {}

    def run(user: User) -> None:
        results[user.name] = as_user(
            user, where[user.name], "queue", "run", "--json", "--policy", "fifo", timeout=240
        )

    threads = [threading.Thread(target=run, args=(u,)) for u in (a, b)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for name, (code, out, err) in results.items():
        assert code == 0, f"{name}: {err}"
        report = json.loads(out)
        assert [j["end"] for j in report["jobs"]] == ["ok"] * 3, report["jobs"]
    for user in (a, b):
        _, listed, _ = as_user(user, where[user.name], "queue", "--json")
        assert {j["state"] for j in json.loads(listed)["jobs"]} == {"done"}


def as_user_proc(user: User, code: str) -> subprocess.Popen[str]:
    """Python ``code`` running as ``user`` (stdin kept open: it may wait on it)."""
    return subprocess.Popen(
        [SYSTEM_PYTHON, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={
            "PATH": "/usr/bin:/bin",
            "PYTHONPATH": os.pathsep.join([str(ROOT), sysconfig.get_paths()["purelib"]]),
            "MEMGOV_DIR": os.environ["MEMGOV_DIR"],
            "MEMGOV_DEVICES": DEVICES,
        },
        user=user.uid,
        group=user.uid,
        extra_groups=[],
    )


def _live(shared_dir: Path, user: User) -> list[dict[str, Any]]:
    folder = shared_dir / "v1" / "_queue" / str(user.uid) / "live"
    found = []
    for path in folder.glob("*.json") if folder.exists() else []:
        with contextlib.suppress(OSError, ValueError):
            found.append(json.loads(path.read_text()))
    return found


def test_another_users_record_naming_a_queue_jobs_pid_is_not_the_queues(
    users: dict[str, User],  # noqa: F811
    shared: Path,  # noqa: F811
    base: Path,  # noqa: F811
) -> None:
    a, b = users["mgl_a"], users["mgl_b"]
    folder = home(base, a)
    release, second = folder / "release", folder / "second-started"
    hold = (
        "import os, pathlib, time, memgov\n"
        "c = memgov.claim(int(os.environ['MEMGOV_CLAIM']), device=os.environ['MEMGOV_DEVICE'],"
        " wait=300)\n"
        f"while not pathlib.Path({str(release)!r}).exists(): time.sleep(0.05)\n"
    )
    code, _, err = as_user(
        a, folder, "queue", "add", "--claim", "20GiB", "--", "python3", "-c", hold
    )
    assert code == 0, err
    results: dict[str, Any] = {}
    runner = threading.Thread(
        target=lambda: results.update(
            run=as_user(a, folder, "queue", "run", "--json", "--policy", "fifo", timeout=240)
        )
    )
    runner.start()
    planter = None
    try:
        wait_for_child = [d for d in _live(shared, a) if isinstance(d.get("child"), int)]
        deadline = time.monotonic() + 60
        while not wait_for_child:
            assert time.monotonic() < deadline, "the first job never started"
            time.sleep(0.05)
            wait_for_child = [d for d in _live(shared, a) if isinstance(d.get("child"), int)]
        child = wait_for_child[0]["child"]
        # b plants a held record of 30 GiB naming a's job's pid, with its start tick (what
        # anyone reads in /proc) so that it is live: 64 - 20 - 30 leaves 14 GiB.
        planter = as_user_proc(
            b,
            "import sys\n"
            "from memgov._gpu.devices import candidates\n"
            "from memgov._ledger.ledger import DeviceLedger, record_payload\n"
            "d = candidates('auto')[0]\n"
            "p = record_payload('claim', d, 30 * 2**30, 'planted', 'soft')\n"
            f"p['pid'] = {child}\n"
            f"stat = open('/proc/{child}/stat').read().rsplit(')', 1)[-1].split()\n"
            "p['start'] = int(stat[19])\n"
            "held = DeviceLedger(d).add('claims', p)\n"
            "print('planted', flush=True)\n"
            "sys.stdin.read()\n",
        )
        assert planter.stdout is not None and planter.stdout.readline().strip() == "planted"
        mark = f"import pathlib; pathlib.Path({str(second)!r}).touch()"
        code, _, err = as_user(
            a, folder, "queue", "add", "--claim", "20GiB", "--", "python3", "-c", mark
        )
        assert code == 0, err
        time.sleep(3)  # several decisions of a's runner with b's record in the ledger
        assert not second.exists()  # 20 GiB does not fit the 14 GiB left: not started
        _, listed, _ = as_user(a, folder, "queue", "--json")
        assert [j["state"] for j in json.loads(listed)["jobs"]] == ["running", "queued"]
    finally:
        release.touch()
        if planter is not None:
            planter.communicate("", timeout=60)
        runner.join()
    code, out, err = results["run"]
    assert code == 0, err
    assert [j["end"] for j in json.loads(out)["jobs"]] == ["ok", "ok"]
    assert second.exists()


def test_another_uids_file_named_like_a_job_is_a_problem_not_a_crash(
    users: dict[str, User],  # noqa: F811
    base: Path,  # noqa: F811
) -> None:
    a = users["mgl_a"]
    store = Store()
    (job,) = q.add([job_spec({"cmd": ["true"], "claim": "1GiB"}, "job", base)], store)
    foreign = store.path / "jobs" / "7.json"
    foreign.write_text(json.dumps(store.get(job.id).to_json()))
    os.chown(foreign, a.uid, a.uid)  # a job file of another uid in this user's store
    listed = memgov_cli("queue", "--json")
    assert listed.returncode == 0, listed.stderr
    (problem,) = json.loads(listed.stdout)["problems"]
    assert f"belongs to uid {a.uid}" in problem
    ran = memgov_cli("queue", "run", "--json")
    assert ran.returncode == 0, ran.stderr
    assert [j["end"] for j in json.loads(ran.stdout)["jobs"]] == ["ok"]


def test_roots_gc_clears_a_queue_or_profile_folder_another_user_squats(
    users: dict[str, User],  # noqa: F811
    shared: Path,  # noqa: F811
    base: Path,  # noqa: F811
) -> None:
    a, b = users["mgl_a"], users["mgl_b"]
    folder = home(base, a)
    squats = [shared / "v1" / part / str(a.uid) for part in ("_queue", "_profiles")]
    for path in squats:
        made = as_user_proc(
            b,
            f"import os; os.mkdir({str(path)!r}, 0o777); os.mkdir({str(path / 'jobs')!r}); "
            f"open({str(path / 'jobs' / '1.json')!r}, 'w').write('{{}}')",
        )
        assert made.wait(60) == 0, made.communicate()
    code, _, err = as_user(a, folder, "queue", "add", "--claim", "1GiB", "--", "true")
    assert code == 2 and f"belongs to uid {b.uid}" in err  # locked out
    gc = memgov_cli("gc")
    assert gc.returncode == 0, gc.stderr
    for path in squats:
        assert f"removed {path} (uid {b.uid}'s" in gc.stdout
        assert not path.exists()
    code, _, err = as_user(a, folder, "queue", "add", "--claim", "1GiB", "--", "true")
    assert code == 0, err
    profiles = as_user_proc(a, "from memgov._files import flock\nwith flock.private_folder(): pass")
    assert profiles.wait(60) == 0, profiles.communicate()  # a's profile store is a's own again
    assert (shared / "v1" / "_profiles" / str(a.uid)).stat().st_uid == a.uid
