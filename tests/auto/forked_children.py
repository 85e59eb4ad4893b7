"""A governed program (run under MEMGOV_CLAIM) that starts children the ways training scripts do:
python forked_children.py KIND [METHOD] [hang].

KIND dataloader: a torch DataLoader, 2 workers, persistent_workers=True, start method METHOD
    (fork, spawn, forkserver), two epochs; fork: a plain os.fork(); pool: a multiprocessing Pool
    (fork) of 2. Every child reports its PID and the descriptors it holds into MEMGOV_DIR.
    Prints one JSON line: {"parent": PID, "children": [{"pid": PID, "ledger_fds": COUNT}, ...],
    "alive": [PIDs of the children that stay alive (hang)], "semaphores": [the names of the
    named semaphores its multiprocessing objects hold then, /dev/shm/sem.NAME]}.
hang: the children then stay alive (a worker stuck in its dataset, a child asleep; each marks
    itself in folder $HANG_MARKS first) and so does the parent, until the test kills them; without
    it the program ends normally.
TRACKER_FD: the write end of a multiprocessing resource tracker the test started, used in
    place of one of the program's own (see below).
"""

from __future__ import annotations

import gc
import json
import multiprocessing
import multiprocessing.resource_tracker
import multiprocessing.synchronize
import os
import sys
import threading
import time

if "TRACKER_FD" in os.environ:
    # The test's tracker, outside this program's process group: the test kills that group with
    # SIGKILL, and a tracker of the program's own would die with it, leaving every semaphore
    # the program created in /dev/shm. The test's one sees the group's end (its pipe closes)
    # and unlinks them. (A spawned child is handed its parent's tracker the same way.)
    tracker = multiprocessing.resource_tracker._resource_tracker
    tracker._fd = int(os.environ["TRACKER_FD"])  # type: ignore[attr-defined]

import torch  # the governed program's first framework import: the claim is taken here
from torch.utils.data import DataLoader, Dataset


def ledger_fds() -> list[str]:
    """Paths under MEMGOV_DIR this process holds open (a record's lock lives with its fd)."""
    root = os.path.realpath(os.environ["MEMGOV_DIR"])
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # the listing's own descriptor, closed by now
        if target.startswith(root):
            found.append(target)
    return found


def me() -> dict[str, object]:
    return {"pid": os.getpid(), "ledger_fds": len(ledger_fds())}


def hang_forever() -> None:
    marks = os.environ["HANG_MARKS"]
    open(os.path.join(marks, str(os.getpid())), "w").close()
    time.sleep(3600)


def wait_for_marks(count: int) -> None:
    """Until ``count`` children are in hang_forever (work handed to them is really theirs)."""
    while len(os.listdir(os.environ["HANG_MARKS"])) < count:
        time.sleep(0.05)


def say(data: dict[str, object]) -> None:
    os.write(1, (json.dumps(data) + "\n").encode())


class Probe(Dataset):
    """Each item: the worker's PID and its ledger descriptors; a negative index never returns."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> torch.Tensor:
        if index < 0:
            hang_forever()
        return torch.tensor([os.getpid(), len(ledger_fds())])


def dataloader(method: str, hang: bool) -> list[dict[str, object]]:
    loader = DataLoader(
        Probe(),
        batch_size=1,
        num_workers=2,
        persistent_workers=True,
        multiprocessing_context=method,
    )
    seen: dict[int, int] = {}
    for _ in range(2):  # two epochs: persistent workers serve both
        for batch in loader:
            pid, fds = (int(v) for v in batch[0])
            seen[pid] = max(fds, seen.get(pid, 0))
    if hang:
        # Workers whose items never come: they stay alive, inside the dataset, after the parent.
        stuck = iter(
            DataLoader(
                Probe(),
                batch_size=1,
                sampler=[-1, -2],
                num_workers=2,
                multiprocessing_context=method,
            )
        )
        threading.Thread(target=next, args=(stuck,), daemon=True).start()
        wait_for_marks(2)
    return [{"pid": pid, "ledger_fds": fds} for pid, fds in sorted(seen.items())]


def plain_fork(hang: bool) -> list[dict[str, object]]:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        if hang:
            open(os.path.join(os.environ["HANG_MARKS"], str(os.getpid())), "w").close()
        os.write(write, json.dumps(me()).encode())
        os.close(write)
        if hang:
            hang_forever()
        sys.exit(0)  # a normal exit: the child's atexit handlers run (they must release nothing)
    os.close(write)
    with os.fdopen(read) as pipe:
        child = json.loads(pipe.read())
    if not hang:
        os.waitpid(pid, 0)
        child["parent_records_after"] = records()
    return [child]


def records() -> int:
    """Live records in this ledger (claims and CPU shares): the parent's two, while it lives."""
    from memgov import _status
    from memgov._cpu import share as _cpushare

    claims = [c for d in _status.status()["devices"] for c in d["claims"]]
    return len(claims) + len(_cpushare.peers())


def pool(hang: bool) -> list[dict[str, object]]:
    context = multiprocessing.get_context("fork")
    workers = context.Pool(2)
    found = workers.map(_report, range(4))
    if hang:
        workers.map_async(_sleep, range(2), chunksize=1)  # each worker in a task that never ends
        wait_for_marks(2)
        return list({c["pid"]: c for c in found}.values())
    workers.close()
    workers.join()
    return list({c["pid"]: c for c in found}.values())


def _report(_index: int) -> dict[str, object]:
    time.sleep(0.2)  # both workers get a task
    return me()


def _sleep(_index: int) -> None:
    hang_forever()


def semaphores() -> list[str]:
    """The named semaphores this program's multiprocessing objects hold (a fork context's are
    unlinked at once: they have no name)."""
    held = [o for o in gc.get_objects() if isinstance(o, multiprocessing.synchronize.SemLock)]
    names = {o._semlock.name for o in held}  # type: ignore[attr-defined]
    return sorted(n.lstrip("/") for n in names if n)


def main() -> None:
    kind = sys.argv[1]
    hang = sys.argv[-1] == "hang"
    if hang:
        os.makedirs(os.environ["HANG_MARKS"], exist_ok=True)
    if kind == "dataloader":
        children = dataloader(sys.argv[2], hang)
    elif kind == "fork":
        children = plain_fork(hang)
    else:
        children = pool(hang)
    stuck = [int(n) for n in os.listdir(os.environ["HANG_MARKS"])] if hang else []
    say({"parent": os.getpid(), "children": children, "alive": stuck, "semaphores": semaphores()})
    if hang:
        time.sleep(3600)


if __name__ == "__main__":
    main()
