"""How pack starts a job: a plain process, a process in its own PID namespace, or a container.

Every runner starts the job in a new session (its own process group), so a Ctrl-C typed at pack
reaches pack alone, and pack can end a job together with everything it started.

- ``process``: the manifest's command as is.
- ``namespace``: ``unshare --pid --fork --mount-proc --kill-child`` (root only), the way a container
  runs a job: the job sees its own PIDs, so only the ledger's flock-based records (not PIDs) can
  tell whose claim is alive. A small ``sh`` is the namespace's PID 1 and the trainer its child:
  PID 1 of a namespace ignores signals it has no handler for, which would hide a kill.
  ``--kill-child`` ends the namespace when unshare dies.
- ``docker``: ``docker run`` of the image built from examples/docker (``memgov-mnist``), with the
  ledger folder bind-mounted at the same path (same inodes: the flocks are shared), the experiment
  folder read-only at /experiment, the manifest command's first word as entrypoint (the image's
  own is the trainer) and the job's environment passed with ``-e``. ``--init`` makes docker's
  tini PID 1, which passes SIGTERM on to the trainer (PID 1 itself ignores signals it has no
  handler for) and exits 128 + N when the trainer dies of signal N, as ``docker run`` then does.
  ``--network none``: a trainer needs no network, and the engine may run without a bridge. That
  image sets ``MEMGOV_CLAIM=1GiB``; greedy jobs get ``MEMGOV_CLAIM=off`` and the frameworks' own
  preallocation defaults back (importing memgov would otherwise turn greedy preallocation off).
  A job is stopped through the engine (``docker kill --signal``), never by killing the ``docker
  run`` client, whose death would leave the container running; after a run every container of
  this pack that is still there is removed (:meth:`DockerRunner.cleanup`). Its host processes are
  the members of the container's cgroup (``docker inspect`` gives its first process). Needs a
  running engine (``docker info``).
- ``preload``: jobs forked from one process that imported the framework once (preload.py).

Runners are looked up by name (:data:`RUNNERS`, :func:`make`): each is a subclass of
:class:`Runner` whose ``name`` is its key, made by its :meth:`Runner.create` from one
:class:`RunnerRequest`; its module is imported only when it is made, so this module imports
none of them (preload.py imports this one for the base class).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from memgov._base.errors import ConfigError

RUNNERS = {
    "process": "memgov.pack.runners",
    "namespace": "memgov.pack.runners",
    "docker": "memgov.pack.runners",
    "preload": "memgov.pack.preload",
}
"""Every runner by name, and the module that defines it (imported when the runner is made)."""
RUNNER_CHOICES = ("auto", *RUNNERS)
"""``--runner``: a runner by name, or ``auto`` (process or preload by host memory: plan.py)."""
DOCKER_IMAGE = "memgov-mnist"
DOCKER_WORKDIR = "/experiment"
INSPECT_EVERY_S = 1.0


class RunnerError(ConfigError):
    """A runner that cannot work on this machine, with what it needs."""

    __module__ = "memgov.pack"  # raised by pack, importable from memgov.pack


@dataclass(frozen=True)
class RunnerRequest:
    """Everything a runner may be made from (each takes what it needs)."""

    framework: str = "torch"
    image: str = DOCKER_IMAGE
    ledger: Path | None = None
    gpu: str | None = None
    mps_pipe: Path | None = None


class Runner:
    name = "process"
    python_in_job: str | None = None
    """The interpreter for {python}; None: the one running pack."""

    @classmethod
    def create(cls, request: RunnerRequest) -> Runner:
        return cls()

    def check(self) -> None:
        """Raise RunnerError when this runner cannot start jobs here."""

    def launch(
        self, argv: list[str], env: dict[str, str], cwd: Path, label: str, base_env: dict[str, str]
    ) -> tuple[list[str], dict[str, str], str | None]:
        """(argv to spawn, full environment, container name or None)."""
        return argv, {**base_env, **env}, None

    def decode_exit(self, returncode: int) -> tuple[int | None, int | None]:
        """(exit code, signal number) of the job itself."""
        if returncode < 0:
            return None, -returncode
        return returncode, None

    def stop(self, pgid: int, container: str | None, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)

    def host_root(self, pid: int, container: str | None) -> int | None:
        """The host PID under which the job's processes are found (for NVML and /proc)."""
        return pid

    def host_pids(self, root: int) -> list[int] | None:
        """Every host PID of the job, when the runner knows them all; None: ``root``'s tree."""
        return None

    def cleanup(self) -> list[str]:
        """After a run: remove what the runner left behind; return what was removed."""
        return []

    def summary(self) -> dict[str, object] | None:
        """What the runner itself did in the run that just ended (after cleanup), or None."""
        return None


class NamespaceRunner(Runner):
    name = "namespace"

    def check(self) -> None:
        if shutil.which("unshare") is None:
            raise RunnerError(
                "--runner namespace needs util-linux's `unshare` on PATH; "
                "accepted runners here: process"
            )
        if os.geteuid() != 0:
            raise RunnerError(
                "--runner namespace needs root (unshare --pid --mount-proc); run pack as root, "
                "or use --runner process"
            )

    def launch(
        self, argv: list[str], env: dict[str, str], cwd: Path, label: str, base_env: dict[str, str]
    ) -> tuple[list[str], dict[str, str], str | None]:
        # `; exit $?` stops sh from exec'ing the trainer (it would become PID 1).
        wrapped = [
            "unshare",
            "--pid",
            "--fork",
            "--mount-proc",
            "--kill-child",
            "--",
            "/bin/sh",
            "-c",
            '"$@"; exit $?',
            "sh",
            *argv,
        ]
        return wrapped, {**base_env, **env}, None

    def decode_exit(self, returncode: int) -> tuple[int | None, int | None]:
        if returncode < 0:
            return None, -returncode  # unshare itself was killed
        if returncode > 128:  # sh's "killed by signal N" convention
            return None, returncode - 128
        return returncode, None


class DockerRunner(Runner):
    name = "docker"
    python_in_job = "python"

    @classmethod
    def create(cls, request: RunnerRequest) -> Runner:
        assert request.ledger is not None
        return cls(request.image, request.ledger, request.gpu, request.mps_pipe)

    def __init__(self, image: str, ledger: Path, gpu: str | None, mps_pipe: Path | None) -> None:
        self.image = image
        self.ledger = ledger
        self.gpu = gpu
        self.mps_pipe = mps_pipe
        self.mounts: list[Path] = []
        """Host folders the jobs share, mounted at the same path (pack's compilation cache)."""
        self.prefix = f"memgov-pack-{os.getpid()}-{secrets.token_hex(2)}-"
        """Every container of this pack is named with it (cleanup finds them by it)."""
        self._next_inspect: dict[str, float] = {}

    def check(self) -> None:
        if shutil.which("docker") is None:
            raise RunnerError(
                "--runner docker: no `docker` on PATH; accepted runners here: "
                "process, namespace (as root)"
            )
        try:
            info = _docker("info", timeout=15)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise RunnerError(
                f"--runner docker: `docker info` failed ({exc}); no container engine answers"
            ) from None
        if info.returncode != 0:
            said = (info.stderr or info.stdout).strip().splitlines()
            raise RunnerError(
                "--runner docker: no container engine answers (`docker info` exited "
                f"{info.returncode}: {said[-1] if said else 'no output'}); start the engine, or "
                "use --runner process / namespace"
            )
        image = _docker("image", "inspect", self.image, timeout=15)
        if image.returncode != 0:
            raise RunnerError(
                f"--runner docker: image {self.image!r} not found; build it from "
                f"examples/docker (examples/docker/build.sh, or docker build -f "
                f"examples/docker/Dockerfile -t {DOCKER_IMAGE} .) or name another with --image"
            )

    def launch(
        self, argv: list[str], env: dict[str, str], cwd: Path, label: str, base_env: dict[str, str]
    ) -> tuple[list[str], dict[str, str], str | None]:
        name = f"{self.prefix}{label}-{secrets.token_hex(3)}"
        # --hostname: claim records carry their holder's hostname, so `memgov status` on the
        # host names each container's claim (PIDs inside containers all look alike).
        line = [
            "docker",
            "run",
            "--rm",
            "--init",
            "--name",
            name,
            "--hostname",
            name,
            "--network",
            "none",
            "-v",
            f"{self.ledger}:{self.ledger}",
            "-v",
            f"{cwd}:{DOCKER_WORKDIR}:ro",
            "-w",
            DOCKER_WORKDIR,
        ]
        if self.gpu is not None:
            line += ["--gpus", f"device={self.gpu}"]
        for folder in self.mounts:
            line += ["-v", f"{folder}:{folder}"]
        if self.mps_pipe is not None:
            # MPS clients talk to the daemon through its pipe folder and shared memory.
            line += ["--ipc=host", "-v", f"{self.mps_pipe}:{self.mps_pipe}"]
        wanted = dict(env)
        if "MEMGOV_CLAIM" not in wanted:  # greedy: undo the image's claim and memgov's defaults
            from memgov import _adapters

            wanted["MEMGOV_CLAIM"] = "off"
            for facts in _adapters.facts().values():  # the frameworks' own (their greedy_env)
                wanted.update(facts.greedy_env)
        for key, value in sorted(wanted.items()):
            if key != "CUDA_VISIBLE_DEVICES":  # --gpus decides what the container sees
                line += ["-e", f"{key}={value}"]
        line += ["--entrypoint", argv[0], self.image, *argv[1:]]
        return line, dict(base_env), name

    def decode_exit(self, returncode: int) -> tuple[int | None, int | None]:
        if returncode < 0:
            return None, -returncode  # the docker client itself was killed
        if returncode > 128:  # tini (--init) and docker run: 128 + the trainer's signal
            return None, returncode - 128
        return returncode, None

    def stop(self, pgid: int, container: str | None, sig: int) -> None:
        if container is None:
            super().stop(pgid, container, sig)
            return
        # Through the engine only: a killed `docker run` client leaves its container running.
        # A container not created yet is caught by cleanup() once the run has ended.
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            _docker("kill", "--signal", signal.Signals(sig).name, container, timeout=15)

    def cleanup(self) -> list[str]:
        """Remove every container of this pack still there (created but never started, or
        stopped while its client was being killed); return their names."""
        try:
            found = _docker(
                "ps", "-a", "--filter", f"name=^{self.prefix}", "--format", "{{.Names}}", timeout=30
            )
        except (OSError, subprocess.TimeoutExpired):
            return []
        names = found.stdout.split()
        if names:
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                _docker("rm", "-f", *names, timeout=60)
        return names

    def host_root(self, pid: int, container: str | None) -> int | None:
        if container is None:
            return None
        # The sampler asks every 0.2 s until the container runs; 25 starting containers must
        # not cost 125 `docker inspect` processes a second.
        now = time.monotonic()
        if now < self._next_inspect.get(container, 0.0):
            return None
        self._next_inspect[container] = now + INSPECT_EVERY_S
        try:
            got = _docker("inspect", "-f", "{{.State.Pid}}", container, timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            return None
        text = got.stdout.strip()
        return int(text) if text.isdigit() and int(text) > 0 else None

    def host_pids(self, root: int) -> list[int] | None:
        return cgroup_members(root)


def cgroup_members(
    pid: int, proc: Path = Path("/proc"), cgroups: Path = Path("/sys/fs/cgroup")
) -> list[int] | None:
    """Host PIDs of every process in ``pid``'s cgroup: a container's processes, also those not
    descended from its first one (``docker exec``). None when ``pid`` shares pack's own cgroup
    (no container around it) or nothing can be read; the caller then walks ``pid``'s children."""
    try:
        theirs = _cgroup_paths((proc / str(pid) / "cgroup").read_text())
        mine = _cgroup_paths((proc / "self" / "cgroup").read_text())
    except OSError:
        return None
    # cgroup v1 (one tree per controller; pids or memory are mounted wherever docker runs) and
    # v2 (the unified tree, mounted at the top or, on hybrid hosts, at unified/).
    for key, subdirs in (("pids", ("pids",)), ("memory", ("memory",)), ("", ("", "unified"))):
        path = theirs.get(key)
        if path is None or path in ("", "/") or path == mine.get(key):
            continue
        for subdir in subdirs:
            try:
                text = (cgroups / subdir / path.lstrip("/") / "cgroup.procs").read_text()
            except OSError:
                continue
            members = sorted({int(t) for t in text.split() if t.isdigit()})
            if members:
                return members
    return None


def _cgroup_paths(text: str) -> dict[str, str]:
    """/proc/PID/cgroup as {controller: path}: "" is the v2 tree; "cpu,cpuacct" gives both."""
    paths: dict[str, str] = {}
    for line in text.splitlines():
        _hier, sep, rest = line.partition(":")
        controllers, sep2, path = rest.partition(":")
        if not sep or not sep2:
            continue
        for controller in controllers.split(",") if controllers else [""]:
            paths.setdefault(controller, path)
    return paths


def _docker(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["docker", *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def make(name: str, request: RunnerRequest) -> Runner:
    """The runner called ``name`` (a key of :data:`RUNNERS`), made for ``request``."""
    module = RUNNERS.get(name)
    if module is None:
        raise RunnerError(f"--runner {name!r}: accepted {', '.join(RUNNERS)}")
    importlib.import_module(module)
    found = [cls for cls in _kinds(Runner) if cls.name == name]
    if len(found) != 1:
        raise RuntimeError(f"{module} defines {len(found)} runners named {name!r}, not one")
    return found[0].create(request)


def _kinds(cls: type[Runner]) -> Iterator[type[Runner]]:
    yield cls
    for sub in cls.__subclasses__():
        yield from _kinds(sub)
