"""``--runner preload``: jobs forked from one process that has imported the framework already.

Each torch job spawned as a process holds ~490 MiB of private host memory right after ``import
torch`` (of ~850 MiB once training, USS, on the H200 with 118 jobs), and 140 jobs import torch 140
times on 16 cores. The remedy of gunicorn's ``--preload``, Android's zygote and multiprocessing's
forkserver: one process per run (memgov/pack/_zygote.py) imports the framework once, and every job
is forked from it, sharing the import's pages copy-on-write.

A job is still a process pack spawns in its own session, as with the process runner: a tiny
launcher (memgov/pack/_launch.py, a bare ``python -I -S``) that has the zygote fork the job with
the launcher's stdin/stdout/stderr, forwards pack's signals to it and exits as the job did (the
launcher's docstring has the protocol). pack's sampler counts the launcher and the forked child
(and the child's own children) as the job. The zygote starts with a run's first job and stops
at the run's end (:meth:`PreloadRunner.cleanup`, also after Ctrl-C); its memory, shared by all
jobs, is reported once in the run's ``runner_details``.

Only ``python SCRIPT ARGS`` is forked (SCRIPT a ``.py`` file, the interpreter the zygote runs);
any other command is spawned as the process runner would, with a note in the ``runner_details``.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import psutil

from memgov._base import settings as _settings, signals as _signals
from memgov.pack.runners import Runner, RunnerRequest

ZYGOTE_START_S = 60.0
"""How long the zygote may take to bind its socket (an interpreter start and memgov's import,
well under a second; long only on a machine starting 140 other processes)."""
STOP_S = 5.0
SOCKET_PATH_MAX = 100
"""A UNIX socket's path holds at most 107 bytes (sun_path)."""
AUTOENABLE_PREFIXES = _settings.TRIGGERS
"""What wakes auto-enable: the zygote's environment has none of it (it must claim nothing)."""
PYTHON_NAME = re.compile(r"python[0-9.]*$")
LAUNCHER = Path(__file__).with_name("_launch.py")


class PreloadRunner(Runner):
    name = "preload"

    @classmethod
    def create(cls, request: RunnerRequest) -> Runner:
        return cls(request.framework)

    def __init__(self, framework: str) -> None:
        self.module = framework  # an adapter's name is its framework's module (docs/adapters.md)
        self._zygote: subprocess.Popen[bytes] | None = None
        self._python: str | None = None
        self._dir: Path | None = None
        self._failed: str | None = None
        self._notes: list[str] = []
        self._report: dict[str, Any] | None = None
        self._pidfiles: dict[int, Path] = {}
        self._children: dict[int, int] = {}
        """launcher PID -> its job's PID, this run."""

    # -- starting jobs -------------------------------------------------------------------------
    def launch(
        self, argv: list[str], env: dict[str, str], cwd: Path, label: str, base_env: dict[str, str]
    ) -> tuple[list[str], dict[str, str], str | None]:
        full = {**base_env, **env}
        why = self._unforkable(argv, cwd)
        if why is None:
            why = self._ensure_zygote(argv[0], base_env, cwd)
        if why is not None:
            self._note(f"{label}: spawned as a plain process ({why})")
            return argv, full, None
        assert self._dir is not None
        wrapped = [
            argv[0],
            "-I",
            "-S",
            str(LAUNCHER),
            str(self._dir / "zygote.sock"),
            str(self._dir / "pids" / label),
            "--",
            *argv,
        ]
        return wrapped, full, None

    def _unforkable(self, argv: list[str], cwd: Path) -> str | None:
        """Why ``argv`` cannot be forked from the zygote, or None."""
        if len(argv) < 2 or not PYTHON_NAME.match(os.path.basename(argv[0])):
            return f"the command {argv[:2]} is not `python SCRIPT ...`"
        if argv[1].startswith("-") or not argv[1].endswith(".py"):
            return f"{argv[1]!r} is not a script file (interpreter options are not forked)"
        if not (cwd / argv[1]).is_file():
            return f"no script {argv[1]!r} in {cwd}"
        if self._python is not None and argv[0] != self._python:
            return f"interpreter {argv[0]} is not the zygote's ({self._python})"
        return None

    def _ensure_zygote(self, python: str, base_env: dict[str, str], cwd: Path) -> str | None:
        if self._failed is not None:
            return self._failed
        if self._zygote is not None:
            return None
        self._python = python
        self._dir = Path(tempfile.mkdtemp(prefix="memgov-preload-"))  # 0700: ours alone
        if len(str(self._dir / "zygote.sock")) > SOCKET_PATH_MAX:  # a long TMPDIR
            self._dir.rmdir()
            self._dir = Path(tempfile.mkdtemp(prefix="memgov-preload-", dir="/tmp"))
        (self._dir / "pids").mkdir()
        env = {k: v for k, v in base_env.items() if not k.startswith(AUTOENABLE_PREFIXES)}
        log = open(self._dir / "zygote.log", "wb")  # noqa: SIM115 (the zygote holds it)
        argv = [python, "-m", "memgov.pack._zygote", "--framework", self.module]
        argv += ["--socket", str(self._dir / "zygote.sock")]
        argv += ["--status", str(self._dir / "zygote.json")]
        try:
            with _signals.deferred():  # started and recorded in one step (pack/jobs.py)
                self._zygote = subprocess.Popen(
                    argv,
                    cwd=cwd,
                    env=env,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    start_new_session=True,
                )  # Ctrl-C reaches pack alone, which stops it
        except OSError as exc:
            self._failed = f"the zygote could not start: {exc.strerror or exc}"
            return self._failed
        finally:
            log.close()
        assert self._zygote.stdout is not None
        ready, _, _ = select.select([self._zygote.stdout], [], [], ZYGOTE_START_S)
        line = self._zygote.stdout.readline() if ready else b""
        if line.strip() != b"listening":
            self._stop_zygote()
            tail = self._log_tail()
            self._failed = "the zygote did not start" + (f": {tail}" if tail else "")
            return self._failed
        return None

    # -- stopping and watching jobs ------------------------------------------------------------
    def stop(self, pgid: int, container: str | None, sig: int) -> None:
        super().stop(pgid, container, sig)  # the launcher forwards it to the job's group
        child = self._child_of(pgid)
        if child is not None and sig == signal.SIGKILL:
            # No forwarding from a SIGKILLed launcher: the job and its group directly (the
            # zygote does it too, once it sees the launcher's connection close).
            for kill in (os.killpg, os.kill):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    kill(child, sig)

    def host_pids(self, root: int) -> list[int] | None:
        child = self._child_of(root)
        if child is None:
            return None  # a plain process, or a launcher whose job is not forked yet
        pids = [root, child]
        with contextlib.suppress(psutil.Error):
            pids += [p.pid for p in psutil.Process(child).children(recursive=True)]
        return pids

    def _child_of(self, launcher: int) -> int | None:
        """The job forked for ``launcher``: its PID file (the launcher's argv names it)."""
        if self._dir is None:
            return None
        known = self._children.get(launcher)
        if known is not None:
            return known
        pidfile = self._pidfiles.get(launcher)
        if pidfile is None:
            try:
                cmdline = psutil.Process(launcher).cmdline()
            except psutil.Error:
                return None
            if len(cmdline) < 6 or cmdline[3] != str(LAUNCHER):
                return None  # a job spawned as a plain process
            pidfile = self._pidfiles[launcher] = Path(cmdline[5])
        try:
            text = pidfile.read_text().strip()
        except OSError:
            return None  # not forked yet
        if not text.isdigit():
            return None
        self._children[launcher] = int(text)
        return int(text)

    # -- after a run ---------------------------------------------------------------------------
    def cleanup(self) -> list[str]:
        """Stop the zygote (every job of the run has ended) and remove its folder."""
        report: dict[str, Any] = {"name": self.name, "framework_module": self.module}
        if self._zygote is not None:
            ended = self._zygote.poll()
            if ended is not None:  # before pack stopped it: its running jobs failed with it
                report["zygote_ended"] = (
                    f"killed by signal {-ended}" if ended < 0 else f"exit status {ended}"
                )
            else:
                with contextlib.suppress(psutil.Error):
                    info = psutil.Process(self._zygote.pid).memory_full_info()
                    report["zygote_rss_mib"] = round(info.rss / 2**20, 1)
                    report["zygote_uss_mib"] = round(info.uss / 2**20, 1)
            self._stop_zygote()
            report.update(self._status())
        if self._failed is not None:
            report["zygote_failed"] = self._failed
        if self._notes:
            report["notes"] = list(self._notes)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
        self._report = report
        self._zygote, self._dir, self._python, self._failed = None, None, None, None
        self._notes = []
        self._pidfiles.clear()
        self._children.clear()
        return []

    def summary(self) -> dict[str, Any] | None:
        return self._report

    def _stop_zygote(self) -> None:
        zygote = self._zygote
        if zygote is None:
            return
        with contextlib.suppress(OSError):
            if zygote.stdin is not None:
                zygote.stdin.close()  # EOF: the zygote stops (as when pack dies)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(zygote.pid, signal.SIGTERM)
        try:
            zygote.wait(STOP_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(zygote.pid, signal.SIGKILL)
            zygote.wait()
        if zygote.stdout is not None:
            zygote.stdout.close()

    def _status(self) -> dict[str, Any]:
        import json

        assert self._dir is not None
        try:
            status: dict[str, Any] = json.loads((self._dir / "zygote.json").read_text())
        except (OSError, ValueError):
            return {"zygote_log": self._log_tail()}
        status.pop("pid", None)
        return {f"zygote_{k}" if not k.startswith("zygote") else k: v for k, v in status.items()}

    def _log_tail(self) -> str:
        if self._dir is None:
            return ""
        with contextlib.suppress(OSError):
            lines = (self._dir / "zygote.log").read_text(errors="replace").strip().splitlines()
            return " | ".join(lines[-3:])
        return ""

    def _note(self, text: str) -> None:
        if len(self._notes) < 20:
            self._notes.append(text)
