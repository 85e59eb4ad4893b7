"""`memgov run --claim SIZE -- CMD...`: start CMD governed by auto-enable.

The memgov process claims nothing: it checks the options, puts them in the environment and
replaces itself with CMD (exec), so signals, exit codes and the process tree stay CMD's own.
The claim is taken inside CMD, at its first GPU framework import (docs/auto-enable.md).
"""

from __future__ import annotations

import os
from typing import NoReturn

from memgov._errors import ConfigError, MemgovError


def command_env(
    claim: str,
    device: str | None,
    wait: float | None,
    strict: bool,
    threads: int | None,
    environ: dict[str, str] | None = None,
) -> dict[str, str]:
    """The environment CMD gets; raises ConfigError for options memgov cannot use (checked by
    the rules of the variables they become, named as options)."""
    from memgov import _settings

    env = dict(os.environ if environ is None else environ)
    value = str(_settings.claim_setting(claim, "--claim"))
    _settings.wait_seconds(wait, "--wait")
    if threads is not None and threads < 1:  # an int option: MEMGOV_THREADS's other forms
        raise ConfigError(f"--threads {threads!r}: accepted a whole number of CPU threads >= 1")
    if device is not None:
        # Checked here, against the GPUs CMD will see (same environment): a device that matches
        # none would otherwise only warn inside CMD and leave it ungoverned.
        from memgov import _devices

        try:
            _devices.candidates(device)
        except MemgovError as exc:
            raise ConfigError(f"--device {device!r}: {exc}") from None
    env["MEMGOV_CLAIM"] = value
    env.pop("MEMGOV_HOLDER", None)  # CMD claims for itself, even when started by a governed job
    for name, setting in (
        ("MEMGOV_DEVICE", device),
        ("MEMGOV_WAIT", None if wait is None else f"{wait:g}"),
        ("MEMGOV_THREADS", None if threads is None else str(threads)),
    ):
        if setting is not None:
            env[name] = setting
    if strict:
        env["MEMGOV_STRICT"] = "1"
    return env


def exec_command(argv: list[str], env: dict[str, str]) -> NoReturn:
    if not argv:
        raise ConfigError("no command given: memgov run --claim 2GiB -- python train.py")
    try:
        os.execvpe(argv[0], argv, env)
    except FileNotFoundError:
        raise MemgovError(f"command not found: {argv[0]!r}") from None
    except PermissionError:
        raise MemgovError(f"command not executable: {argv[0]!r}") from None
