"""`memgov run --claim SIZE -- CMD...`: start CMD governed by auto-enable.

The memgov process claims nothing: it checks the options, puts them in the environment and
replaces itself with CMD (exec), so signals, exit codes and the process tree stay CMD's own.
The claim is taken inside CMD, at its first GPU framework import (docs/auto-enable.md).
"""

from __future__ import annotations

import os
from typing import NoReturn

from memgov._base.errors import ConfigError, MemgovError
from memgov._base.sizes import Size


def command_env(
    claim: str,
    device: str | None,
    wait: float | None,
    strict: bool,
    threads: int | None,
    environ: dict[str, str] | None = None,
    job: str | None = None,
) -> dict[str, str]:
    """The environment CMD gets; raises ConfigError for options memgov cannot use (checked by
    the rules of the variables they become, named as options)."""
    from memgov._base import settings as _settings

    env = dict(os.environ if environ is None else environ)
    chosen = _settings.claim_setting(claim, "--claim")
    _settings.wait_seconds(wait, "--wait")
    if job is not None:
        job = _settings.job_name(job, "--job")
    if threads is not None and threads < 1:  # an int option: MEMGOV_THREADS's other forms
        raise ConfigError(f"--threads {threads!r}: accepted a whole number of CPU threads >= 1")
    _check_devices(chosen, device)
    env["MEMGOV_CLAIM"] = str(chosen)
    env.pop("MEMGOV_HOLDER", None)  # CMD claims for itself, even when started by a governed job
    env.pop("MEMGOV_WARNED", None)  # and says what fails for it, whatever its parent said
    for name, setting in (
        ("MEMGOV_DEVICE", device),
        ("MEMGOV_WAIT", None if wait is None else f"{wait:g}"),
        ("MEMGOV_THREADS", None if threads is None else str(threads)),
        ("MEMGOV_JOB", job),
    ):
        if setting is not None:
            env[name] = setting
    if strict:
        env["MEMGOV_STRICT"] = "1"
    return env


def _check_devices(chosen: str | Size, device: str | None) -> None:
    """--gpu and a --claim size, against the GPUs CMD will see (the same environment): a
    device that matches none, or a size no device can hold, would otherwise only warn inside
    CMD and leave it running ungoverned. Without any GPU here CMD says so itself."""
    if device is None and not isinstance(chosen, Size):
        return  # nothing to check: growth, auto and off start no NVML here
    from memgov._gpu import devices as _devices

    try:
        found = _devices.candidates(device)
    except MemgovError as exc:
        if device is None:
            return  # no GPU at all: CMD's auto-enable warns (or fails with --strict)
        raise ConfigError(f"--gpu {device!r}: {exc}") from None
    if isinstance(chosen, Size):
        _devices.sizes_on(chosen, found)  # ConfigError naming --claim and the device's size


def exec_command(argv: list[str], env: dict[str, str]) -> NoReturn:
    if not argv:
        raise ConfigError("no command given: memgov run --claim 2GiB -- python train.py")
    try:
        os.execvpe(argv[0], argv, env)
    except FileNotFoundError:
        raise MemgovError(f"command not found: {argv[0]!r}") from None
    except PermissionError:
        raise MemgovError(f"command not executable: {argv[0]!r}") from None
