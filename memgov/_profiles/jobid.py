"""A job's identity: the name its profile (measured peaks, memgov/_profiles/store.py) is kept under.

Given: ``claim(job=...)``, else ``MEMGOV_JOB`` (``memgov run --job`` sets it), verbatim.

Derived from the command otherwise, so that the same training run gets the same name wherever
and whenever it is started:

- the program: ``python SCRIPT``: the script's resolved path (``python main.py`` in its folder
  and ``python ../ex/main.py`` elsewhere are one job; a copy of the script elsewhere is another);
  ``python -m MODULE``: the module's name and the resolved path of its file; ``python -c CODE``:
  the code; anything else: the interpreter's argv[0] name;
- its arguments, as given, except the values of options that name one run rather than the job
  (:data:`VOLATILE`: seeds, output and log folders, run names), which are dropped with their
  option: ``--seed 1`` and ``--seed 2`` are one job, ``--batch-size 64`` and ``128`` are two;
- not the working directory, the interpreter's path (a venv), the environment or the time.

The name is ``<label>-<hash>``: the label is what people read (the script's file name, the
module's name), the hash (12 hex digits of SHA-256 over the program and kept arguments) tells
apart runs of the same script with other arguments.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys

VOLATILE = (
    "--seed",
    "--manual-seed",
    "--manual_seed",
    "--manualSeed",
    "--random-seed",
    "--random_seed",
    "--out",
    "--outf",
    "--output",
    "--output-dir",
    "--output_dir",
    "--out-dir",
    "--out_dir",
    "--save-dir",
    "--save_dir",
    "--log-dir",
    "--log_dir",
    "--logdir",
    "--logging-dir",
    "--logging_dir",
    "--checkpoint-dir",
    "--checkpoint_dir",
    "--run-name",
    "--run_name",
    "--exp-name",
    "--exp_name",
    "--tag",
    "--wandb-name",
    "--resume",
)
"""Options whose value names one run, not the job: left out of a derived identity. An option
written ``--opt=value`` or ``--opt value`` is dropped whole; flags (no value) are kept."""
_LABEL = re.compile(r"[^A-Za-z0-9_.-]")


def job_for(given: str | None = None, argv: list[str] | None = None) -> tuple[str, str]:
    """(job name, label) of this process: ``given``, else MEMGOV_JOB, else derived from argv."""
    from memgov._base import settings as _settings

    if given is not None:
        name = _settings.job_name(given, "job")
        return name, name
    chosen = _settings.get("MEMGOV_JOB")
    if chosen is not None:
        return chosen, chosen
    return derive(_command() if argv is None else argv)


def derive(argv: list[str]) -> tuple[str, str]:
    """(job name, label) derived from a command ``[interpreter, options..., program, args...]``."""
    program, args = _program(argv)
    kept = kept_arguments(args)
    digest = hashlib.sha256("\0".join([program[1], *kept]).encode("utf-8", "replace"))
    label = _LABEL.sub("_", program[0])[:64] or "python"
    return f"{label}-{digest.hexdigest()[:12]}", label


def kept_arguments(args: list[str]) -> list[str]:
    """``args`` without the volatile options and their values (:data:`VOLATILE`)."""
    kept: list[str] = []
    skip_value = False
    for arg in args:
        if skip_value:
            skip_value = False
            if not arg.startswith("-") or _number(arg):
                continue
        option = arg.split("=", 1)[0]
        if option in VOLATILE:
            skip_value = "=" not in arg
            continue
        kept.append(arg)
    return kept


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _command() -> list[str]:
    """This process's command as ``python [options] program args``: ``sys.argv`` (what the
    program sees: also right in a job forked by pack's preload zygote), with ``-m`` / ``-c``
    taken from ``sys.orig_argv`` where argv lost them."""
    orig = list(getattr(sys, "orig_argv", []) or [])
    argv = list(sys.argv)
    first = argv[0] if argv else ""
    for i, arg in enumerate(orig[1:], 1):
        if arg == "-c" and first == "-c":
            return orig
        if arg == "-m" and i + 1 < len(orig) and first and _resolved(first) == _module_file():
            return [orig[0], "-m", orig[i + 1], *argv[1:]]
    return [sys.executable, *argv] if first else orig or [sys.executable]


_TAKES_VALUE = ("-W", "-X", "--check-hash-based-pycs")


def _program(argv: list[str]) -> tuple[tuple[str, str], list[str]]:
    """((label, what identifies the program), its arguments)."""
    interpreter = os.path.basename(argv[0]) if argv else "python"
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg in ("-m", "-c") and i + 1 < len(argv):
            what, rest = argv[i + 1], argv[i + 2 :]
            if arg == "-c":
                return ("python-c", "-c\0" + what), rest
            return (what, "-m\0" + what + "\0" + _module_file()), rest
        if arg.startswith("-m") and len(arg) > 2:
            return (arg[2:], "-m\0" + arg[2:] + "\0" + _module_file()), argv[i + 1 :]
        if arg == "-" or not arg.startswith("-"):
            break
        i += 2 if arg in _TAKES_VALUE else 1
    if i >= len(argv) or argv[i] == "-":
        return (interpreter or "python", interpreter or "python"), argv[i + 1 :]
    script = argv[i]
    return (os.path.basename(script), _resolved(script)), argv[i + 1 :]


def _resolved(script: str) -> str:
    try:
        return os.path.realpath(script)
    except (OSError, ValueError):
        return script


def _module_file() -> str:
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    return _resolved(path) if isinstance(path, str) else ""
