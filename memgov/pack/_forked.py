"""A child forked by the preload zygote becomes the job: ``python SCRIPT ARGS`` as if spawned.

What a fresh interpreter would have and a fork of the zygote does not, put right here: the job's
descriptors as stdin/stdout/stderr (and Python streams over them, buffered as the job's
PYTHONUNBUFFERED says), the job's environment (``os.environ`` replaced, which also sets the C
environment that libraries read later, e.g. CUDA's and the allocators'), working directory, CPU
affinity and umask, Python's start-up signal handlers and an empty signal mask, ``sys.argv`` and
``sys.path[0]`` (the script's folder), and fresh random state (numpy's global generator was seeded
once, in the zygote; Python's ``random`` reseeds itself at fork).

memgov's auto-enable is entered as the ``memgov-autoenable.pth`` line would at start-up: only when
the job's environment has a trigger (MEMGOV_CLAIM, a scheduler's budget variable). The framework
is already imported, so its import statement would not reach memgov's import hook; instead the
job's first import statement of a framework (``builtins.__import__`` or
``importlib.import_module``, wrapped until then) runs auto-enable's hook, so the claim happens at
the same point of the script as in a spawned job and a refusal under MEMGOV_STRICT=1 is raised
from that import statement. The thread budget sees the framework as imported before the claim
(memgov.adapter.imported_before_claim), which it supports.
"""

from __future__ import annotations

import builtins
import contextlib
import importlib
import io
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

RESTORED = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGPIPE,
    signal.SIGCHLD,
    signal.SIGXFSZ,
)
"""Handlers recorded at the zygote's start (Python's own: SIGINT raises KeyboardInterrupt,
SIGPIPE and SIGXFSZ ignored) and put back in each child."""
PR_SET_NAME = 15


def become_job(
    argv: list[str],
    env: dict[str, str],
    cwd: str,
    cpus: list[int],
    umask: int,
    fds: list[int],
    startup: dict[int, Any],
) -> int:
    """Set this forked child up as ``argv`` (``python SCRIPT ARGS``) and run it; return the exit
    code (SystemExit and KeyboardInterrupt propagate, as in a plain interpreter)."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in fds:
        if fd > 2:
            os.close(fd)
    for sig, handler in startup.items():
        with contextlib.suppress(OSError, ValueError, TypeError):
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    os.umask(umask)
    os.chdir(cwd)
    # os.environb keeps its own copy: clear both, then set both (each sets the C environment).
    os.environb.clear()
    os.environ.clear()
    os.environ.update(env)
    os.environb.update((os.fsencode(k), os.fsencode(v)) for k, v in env.items())
    if cpus:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, cpus)
    _std_streams(bool(env.get("PYTHONUNBUFFERED", "").strip()))
    _reseed()
    script = os.path.abspath(argv[1])
    _name_process(os.path.basename(script))
    sys.argv = list(argv[1:])
    sys.orig_argv = list(argv)
    sys.path[0] = os.path.dirname(script)
    from memgov import _autoenable

    if _autoenable.triggered():
        import memgov

        # What `import memgov` does in a spawned governed job (the .pth imports it).
        for name, value in memgov.NO_GREEDY_PREALLOCATION.items():
            os.environ.setdefault(name, value)
        _arm_autoenable()
    return _run(script)


def _name_process(name: str) -> None:
    """The kernel's name of the process (``ps -o comm``, top, /proc/PID/comm): the script's, not
    the zygote's (its argv, ``ps -o args``, stays the zygote's: a fork cannot change it)."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)


def _std_streams(unbuffered: bool) -> None:
    """New sys.stdin/stdout/stderr over descriptors 0-2, as a fresh interpreter makes them."""
    streams: dict[str, io.TextIOWrapper] = {}
    for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        old = getattr(sys, name)
        encoding = getattr(old, "encoding", None) or "utf-8"
        errors = getattr(old, "errors", None) or "strict"
        if fd == 0:
            source = open(0, "rb", closefd=False)  # noqa: SIM115 (sys.stdin from now on)
            streams[name] = io.TextIOWrapper(source, encoding, errors)
            continue
        with contextlib.suppress(Exception):
            old.flush()
        interactive = os.isatty(fd)
        raw: Any = open(fd, "wb", buffering=0 if unbuffered else -1, closefd=False)  # noqa: SIM115
        streams[name] = io.TextIOWrapper(
            raw, encoding, errors, line_buffering=interactive or fd == 2, write_through=unbuffered
        )
    sys.stdin, sys.stdout, sys.stderr = streams["stdin"], streams["stdout"], streams["stderr"]
    # What the interpreter set at start-up, for code that restores the originals.
    for name, stream in streams.items():
        setattr(sys, f"__{name}__", stream)


def _reseed() -> None:
    """numpy's global generator: seeded from the OS once per process in a spawned job, so each
    fork gets its own seed again (every child would otherwise draw the same numbers)."""
    mtrand = sys.modules.get("numpy.random")
    if mtrand is not None:
        with contextlib.suppress(Exception):
            mtrand.seed()


def _arm_autoenable() -> None:
    from memgov import _autoenable
    from memgov._base import importhook as _importhook

    original_import = builtins.__import__
    original_import_module = importlib.import_module
    frameworks = _importhook.frameworks()
    preloaded = [sys.modules[n] for n in frameworks if n in sys.modules]

    def fire(name: str) -> None:
        if name.partition(".")[0] not in frameworks:
            return
        builtins.__import__ = original_import
        importlib.import_module = original_import_module
        # As _autoenable.start() would, except that a preloaded framework's hook runs here,
        # raising out of the job's import statement (start() swallows errors, rightly so at
        # interpreter start-up).
        _autoenable.start_preloaded(preloaded)

    def hooked_import(
        name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0
    ) -> Any:
        if level == 0:
            fire(name)
        return original_import(name, globals, locals, fromlist, level)

    def hooked_import_module(name: str, package: str | None = None) -> Any:
        if not name.startswith("."):
            fire(name)
        return original_import_module(name, package)

    builtins.__import__ = hooked_import
    importlib.import_module = hooked_import_module


def _run(script: str) -> int:
    """Run ``script`` as ``__main__`` the way ``python SCRIPT`` does (runpy.run_path would set
    sys.argv[0] to the path it is given, and restore the zygote's ``__main__`` afterwards)."""
    import importlib.machinery
    import types

    main = types.ModuleType("__main__")
    main.__file__ = script
    main.__loader__ = importlib.machinery.SourceFileLoader("__main__", script)
    main.__builtins__ = builtins  # type: ignore[attr-defined]
    sys.modules["__main__"] = main
    try:
        with io.open_code(script) as source:
            code = compile(source.read(), script, "exec", dont_inherit=True)
        exec(code, main.__dict__)
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as exc:
        # The traceback python would print: from the script's first frame on, not ours.
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != script:
            tb = tb.tb_next
        hook: Callable[..., Any] = sys.excepthook
        hook(type(exc), exc, tb or exc.__traceback__)
        return 1
    return 0
