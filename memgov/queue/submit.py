"""Jobs into the store: from `memgov queue add` (one command, its folder and environment) or
from a queue file (a run of jobs with arrival times)."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager

from memgov._base.errors import ConfigError, MemgovError
from memgov._base.sizes import Size
from memgov._profiles import jobid as _jobid
from memgov.queue.model import Job
from memgov.queue.queuefile import JobSpec
from memgov.queue.store import Store


def claim_text(claim: str | Size) -> str | int:
    """A spec's claim as the store keeps it: "auto", bytes, or a percentage ("25%")."""
    if isinstance(claim, Size):
        return claim.bytes if claim.bytes is not None else str(claim.value)
    return claim


@contextmanager
def _in_folder(folder: str) -> Iterator[None]:
    old = os.getcwd()
    try:
        os.chdir(folder)
        yield
    finally:
        os.chdir(old)


def profile_name(spec: JobSpec) -> str:
    """The job's name in the profile store: MEMGOV_JOB in its environment, else derived from
    its command in its folder (a relative script resolves there: memgov/_profiles/jobid.py)."""
    given = spec.env.get("MEMGOV_JOB")
    if given and given.strip():
        return given.strip()
    try:
        with _in_folder(spec.cwd):
            return _jobid.derive(spec.cmd)[0]
    except OSError:
        return _jobid.derive(spec.cmd)[0]


def to_job(spec: JobSpec, environ: dict[str, str], batch: str, start: float) -> Job:
    env = {**environ, **spec.env}
    return Job(
        id=0,
        name=spec.name,
        cmd=list(spec.cmd),
        cwd=spec.cwd,
        env=env,
        claim=claim_text(spec.claim),
        arrival=spec.arrival,
        duration=spec.duration,
        kind=spec.kind or spec.name.split()[0].split("-")[0],
        gpu=spec.gpu,
        batch=batch,
        created=start,
        not_before=start + spec.arrival,
        job=profile_name(spec),
    )


def add(
    specs: list[JobSpec],
    store: Store | None = None,
    batch: str = "",
    environ: dict[str, str] | None = None,
    start: float | None = None,
) -> list[Job]:
    """Write ``specs`` as queued jobs; returns them with their ids."""
    store = store or Store()
    start = time.time() if start is None else start
    base = dict(os.environ if environ is None else environ)
    return store.add([to_job(s, base, batch, start) for s in specs])


def check(specs: list[JobSpec], environ: dict[str, str]) -> None:
    """For a job queued on this host (`memgov queue add`, as `memgov run` checks its command),
    what can be known before it is queued, said then (a ConfigError) rather than when it would
    run: its program is found, and this host's GPUs can hold its claim and have its ``gpu``.
    Without any GPU here the runner says so itself. (A queue file's job that no GPU can hold
    fails at once when its run reaches it, saying why, while the others run; a Ray cluster's
    GPUs are not this host's.)"""
    from memgov._gpu import devices as _devices

    try:
        found = _devices.candidates("auto")
    except MemgovError:
        found = []
    for spec in specs:
        what = f"job {spec.name!r}"
        _program(spec, {**environ, **spec.env}.get("PATH", os.defpath), what)
        if found and spec.gpu is not None and spec.gpu >= len(found):
            raise ConfigError(
                f"{what}: gpu {spec.gpu}: accepted a GPU index of this host, 0..{len(found) - 1}"
            )
        if found and isinstance(spec.claim, Size):
            among = found if spec.gpu is None else [found[spec.gpu]]
            _devices.sizes_on(spec.claim, among)  # names the claim and the device's size


def _program(spec: JobSpec, path: str, what: str) -> None:
    program = spec.cmd[0]
    with _in_folder(spec.cwd):
        where = shutil.which(program, path=None if "/" in program else path)
    if where is None:
        raise ConfigError(
            f"{what}: command not found: {program!r} (in {spec.cwd}, on its PATH); accepted a "
            "program on PATH or a path to an executable file"
        )
