"""The exporter beside real users of one host (created as tests/hostile makes them: root, useradd;
``--host-changes``): root's exporter writes nowhere a user's symlink leads, and shows every
user's queue and waiting claims only from files that are that user's."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from tests.hostile.conftest import User, base, shared, start, users  # noqa: F401  (fixtures)

from .conftest import start_exporter, stop_exporter

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.host_changes("creates users mgl_a and mgl_b (useradd), removed after"),
    pytest.mark.skipif(os.geteuid() != 0, reason="creates users: needs root"),
]


def _memgov(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "memgov", *args], capture_output=True, text=True, timeout=120
    )


def test_textfile_never_follows_a_users_symlink_higher_up_its_path(
    users: dict[str, User],  # noqa: F811
    base: Path,  # noqa: F811
) -> None:
    a = users["mgl_a"]
    # A folder only root may enter, with a textfile folder of root's inside it.
    secret = base / "root-only"
    (secret / "textfile").mkdir(parents=True)
    secret.chmod(0o700)
    # mgl_a's own folder on the way, where mgl_a points a link at root's folder.
    mine = base / "mine"
    mine.mkdir()
    os.chown(mine, a.uid, a.uid)
    linked = a.run(f"import os; os.symlink({str(secret)!r}, {str(mine / 'up')!r}); out('linked')")
    assert linked == "linked"
    done = _memgov("exporter", "--textfile", str(mine / "up" / "textfile"), "--once")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "a symlink or not a folder" in done.stderr and str(mine / "up") in done.stderr
    assert list((secret / "textfile").iterdir()) == []  # nothing written where the link led
    # The same folder reached through real folders only is written.
    real = _memgov("exporter", "--textfile", str(secret / "textfile"), "--once")
    assert real.returncode == 0, real.stderr
    assert (secret / "textfile" / "memgov.prom").is_file()


ADD_JOBS = """
import time
from memgov.queue.model import Job
from memgov.queue.store import Store
store = Store()
job = dict(cmd=["true"], cwd="/", env={{}}, created=time.time())
ready, later, running, done = store.add([
    Job(id=0, name="ready", not_before=0.0, **job),
    Job(id=0, name="later", not_before=time.time() + 3600, **job),
    Job(id=0, name="running", not_before=0.0, **job),
    Job(id=0, name="done", not_before=0.0, **job),
])
store.update(running.id, lambda j: setattr(j, "state", "running"))
store.update(done.id, lambda j: setattr(j, "state", "done"))
{extra}
print(store.path)
"""


SYSTEM_PYTHON = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"


def as_user(user: User, code: str) -> str:
    """CODE run as ``user`` by the system's interpreter (the test's may live where users cannot
    read: memgov.queue's imports come after the switch), with memgov on PYTHONPATH; its
    stdout."""
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip(f"needs {SYSTEM_PYTHON} (an interpreter other users may run)")
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": os.pathsep.join([str(ROOT), sysconfig.get_paths()["purelib"]]),
        "MEMGOV_DIR": os.environ["MEMGOV_DIR"],
        "MEMGOV_DEVICES": os.environ["MEMGOV_DEVICES"],
    }
    done = subprocess.run(
        [SYSTEM_PYTHON, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        cwd="/",
        timeout=120,
        user=user.uid,
        group=user.uid,
        extra_groups=[],
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.strip()


def test_every_users_queue_and_waiting_claims_are_shown_from_their_own_files(
    users: dict[str, User],  # noqa: F811
    shared: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    a, b, c = users["mgl_a"], users["mgl_b"], users["mgl_c"]
    a_store = Path(as_user(a, ADD_JOBS.format(extra="")))
    # b's queue, plus what b plants: garbage and a link to a's job in b's own store, and a
    # folder in c's name holding a job that says it is c's.
    queues = shared / "v1" / "_queue"
    as_user(
        b,
        ADD_JOBS.format(
            extra=f"""
import os
jobs = os.path.join(str(store.path), "jobs")
with open(os.path.join(jobs, "77.json"), "w") as f:
    f.write("{{not json")
os.symlink({str(a_store / "jobs" / "1.json")!r}, os.path.join(jobs, "78.json"))
os.makedirs({str(queues / str(c.uid) / "jobs")!r})
with open(os.path.join({str(queues / str(c.uid) / "jobs")!r}, "1.json"), "w") as f:
    f.write(open(os.path.join(jobs, "1.json")).read())
"""
        ),
    )
    # A claim of a's fills the GPU; one of b's waits for it in the admission queue.
    holder = start(
        a, "import memgov, time\nmemgov.claim('60GiB')\nprint('{}', flush=True)\ntime.sleep(300)\n"
    )
    waiter = start(
        b,
        "import memgov, time, threading\nprint('{}', flush=True)\n"
        "memgov.claim('8GiB', wait=300)\ntime.sleep(300)\n",
    )
    server = start_exporter(tmp_path)
    try:
        deadline = time.monotonic() + 120
        while True:
            scrape = server.scrape()
            waiting = {lb["user"]: v for lb, v in scrape["memgov_admission_waiting_claims"]}
            if waiting or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    finally:
        stop_exporter(server)
        for proc in (holder, waiter):
            proc.kill()
            proc.wait()
    assert waiting == {"mgl_b": 1}
    for metric, each in [
        ("memgov_queue_jobs_queued", 2),
        ("memgov_queue_jobs_waiting", 1),
        ("memgov_queue_jobs_running", 1),
    ]:
        shown = {lb["user"]: v for lb, v in scrape[metric]}
        assert shown == {"mgl_a": each, "mgl_b": each}, (metric, shown)  # nothing for mgl_c
    # b's garbage, b's link and the folder b made in c's name.
    assert scrape["memgov_queue_problem_files"][0][1] == 3
    log = server.log.read_text()
    assert f"_queue/{c.uid}: not uid {c.uid}'s folder" in log, log


def test_a_lock_timeout_count_planted_in_another_users_name_is_skipped(
    users: dict[str, User],  # noqa: F811
    shared: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    a, b = users["mgl_a"], users["mgl_b"]
    stats = next(shared.glob("v1/*/stats"))  # the GPU's counters folder (root's gc made it)
    planted = b.run(
        f"open({str(stats / f'u{a.uid}.locktimeouts')!r}, 'w').write('x' * 100); out('planted')"
    )
    assert planted == "planted"
    server = start_exporter(tmp_path)
    try:
        scrape = server.scrape()
    finally:
        stop_exporter(server)
    assert "memgov_admission_lock_timeouts_total" not in scrape  # nobody's count: none shown
    assert scrape["memgov_ledger_readable"][0][1] == 1
