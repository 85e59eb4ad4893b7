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
    """The environment CMD gets; raises ConfigError for options memgov cannot use."""
    from memgov import _autoenable
    from memgov._sizes import parse_size

    env = dict(os.environ if environ is None else environ)
    value = claim.strip()
    if value.lower() in ("growth", "auto", "off"):
        value = value.lower()
    else:
        try:
            parse_size(value, total=2**62, what="--claim")
        except ValueError:
            raise ConfigError(f"--claim {claim!r}: {_autoenable.CLAIM_ACCEPTED}") from None
    if wait is not None and not 0 <= wait < float("inf"):
        raise ConfigError(f"--wait {wait!r}: accepted seconds >= 0")
    if threads is not None and threads < 1:
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
