"""Run Python code as another user: python actor.py UID CODE. Prints what CODE prints.

Starts as root, loads memgov (the interpreter may live in a folder only root can read), drops to
UID (and its gid, no extra groups), then runs CODE with ``out(obj)`` to print one JSON line.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "helpers"))

from claimer import become


def out(obj: object) -> None:
    print("@@" + json.dumps(obj), flush=True)


def _load_cli() -> None:
    """Load the command line and what status, gc and doctor import, by running each once with
    --help and importing their modules: the interpreter's own files may be root's alone."""
    import contextlib
    import io

    import memgov.cli
    from memgov import _doctor, _status  # noqa: F401
    from memgov._cpu import (
        share as _cpushare,  # noqa: F401
        threads as _threads,  # noqa: F401
    )
    from memgov.cli import doctor, status  # noqa: F401

    for command in (["--help"], ["status", "--help"], ["gc", "--help"], ["doctor", "--help"]):
        sys.argv = ["memgov", *command]
        with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
            memgov.cli.main()
    _doctor.diagnose()


def main() -> None:
    uid, code = int(sys.argv[1]), sys.argv[2]
    import fcntl  # noqa: F401  (loaded as root, for CODE)
    import resource  # noqa: F401

    import rich.console
    import rich.markup  # noqa: F401

    import memgov  # noqa: F401
    from memgov import _status  # noqa: F401
    from memgov.cli import render  # noqa: F401

    if "memgov.cli.main" in code:
        _load_cli()  # as root: every module the commands import (see _load_cli)
    become(uid)
    exec(compile(code, "<actor>", "exec"), {"out": out, "__name__": "__actor__"})


if __name__ == "__main__":
    main()
