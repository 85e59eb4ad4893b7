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
  folder at /experiment, the manifest command's first word as entrypoint (the image's own is the
  trainer) and the job's environment passed with ``-e``. That image sets ``MEMGOV_CLAIM=1GiB``;
  greedy jobs get ``MEMGOV_CLAIM=off`` and the frameworks' own preallocation defaults back
  (importing memgov would otherwise turn greedy preallocation off). Needs a running engine
  (``docker info``).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
from pathlib import Path

from memgov._errors import ConfigError

RUNNERS = ("process", "namespace", "docker")
DOCKER_IMAGE = "memgov-mnist"
DOCKER_WORKDIR = "/experiment"
GREEDY_IN_IMAGE = {"MEMGOV_CLAIM": "off", "XLA_PYTHON_CLIENT_PREALLOCATE": "true",
                   "TF_FORCE_GPU_ALLOW_GROWTH": "false"}


class RunnerError(ConfigError):
    """A runner that cannot work on this machine, with what it needs."""


class Runner:
    name = "process"
    python_in_job: str | None = None
    """The interpreter for {python}; None: the one running pack."""

    def check(self) -> None:
        """Raise RunnerError when this runner cannot start jobs here."""

    def launch(self, argv: list[str], env: dict[str, str], cwd: Path, label: str,
               base_env: dict[str, str]) -> tuple[list[str], dict[str, str], str | None]:
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


class NamespaceRunner(Runner):
    name = "namespace"

    def check(self) -> None:
        if shutil.which("unshare") is None:
            raise RunnerError("--runner namespace needs util-linux's `unshare` on PATH; "
                              "accepted runners here: process")
        if os.geteuid() != 0:
            raise RunnerError(
                "--runner namespace needs root (unshare --pid --mount-proc); run pack as root, "
                "or use --runner process"
            )

    def launch(self, argv: list[str], env: dict[str, str], cwd: Path, label: str,
               base_env: dict[str, str]) -> tuple[list[str], dict[str, str], str | None]:
        # `; exit $?` stops sh from exec'ing the trainer (it would become PID 1).
        wrapped = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "--",
                   "/bin/sh", "-c", '"$@"; exit $?', "sh", *argv]
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

    def __init__(self, image: str, ledger: Path, gpu: str | None, mps_pipe: Path | None) -> None:
        self.image = image
        self.ledger = ledger
        self.gpu = gpu
        self.mps_pipe = mps_pipe

    def check(self) -> None:
        if shutil.which("docker") is None:
            raise RunnerError("--runner docker: no `docker` on PATH; accepted runners here: "
                              "process, namespace (as root)")
        try:
            info = subprocess.run(["docker", "info"], capture_output=True, text=True,
                                  timeout=15, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise RunnerError(f"--runner docker: `docker info` failed ({exc}); no container "
                              "engine answers") from None
        if info.returncode != 0:
            said = (info.stderr or info.stdout).strip().splitlines()
            raise RunnerError(
                "--runner docker: no container engine answers (`docker info` exited "
                f"{info.returncode}: {said[-1] if said else 'no output'}); start the engine, or "
                "use --runner process / namespace"
            )
        image = subprocess.run(["docker", "image", "inspect", self.image], capture_output=True,
                               text=True, timeout=15, check=False)
        if image.returncode != 0:
            raise RunnerError(
                f"--runner docker: image {self.image!r} not found; build it from "
                f"examples/docker (docker build -f examples/docker/Dockerfile -t {DOCKER_IMAGE} .)"
                " or name another with --image"
            )

    def launch(self, argv: list[str], env: dict[str, str], cwd: Path, label: str,
               base_env: dict[str, str]) -> tuple[list[str], dict[str, str], str | None]:
        name = f"memgov-pack-{os.getpid()}-{label}-{secrets.token_hex(3)}"
        line = ["docker", "run", "--rm", "--name", name,
                "-v", f"{self.ledger}:{self.ledger}",
                "-v", f"{cwd}:{DOCKER_WORKDIR}", "-w", DOCKER_WORKDIR]
        if self.gpu is not None:
            line += ["--gpus", f"device={self.gpu}"]
        if self.mps_pipe is not None:
            # MPS clients talk to the daemon through its pipe folder and shared memory.
            line += ["--ipc=host", "-v", f"{self.mps_pipe}:{self.mps_pipe}"]
        wanted = dict(env)
        if "MEMGOV_CLAIM" not in wanted:  # greedy: undo the image's claim and memgov's defaults
            wanted.update(GREEDY_IN_IMAGE)
        for key, value in sorted(wanted.items()):
            if key != "CUDA_VISIBLE_DEVICES":  # --gpus decides what the container sees
                line += ["-e", f"{key}={value}"]
        line += ["--entrypoint", argv[0], self.image, *argv[1:]]
        return line, dict(base_env), name

    def stop(self, pgid: int, container: str | None, sig: int) -> None:
        if container is not None:
            subprocess.run(["docker", "kill", "--signal", signal.Signals(sig).name, container],
                           capture_output=True, timeout=15, check=False)
        super().stop(pgid, container, sig)

    def host_root(self, pid: int, container: str | None) -> int | None:
        if container is None:
            return None
        try:
            got = subprocess.run(["docker", "inspect", "-f", "{{.State.Pid}}", container],
                                 capture_output=True, text=True, timeout=5, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return None
        text = got.stdout.strip()
        return int(text) if text.isdigit() and int(text) > 0 else None


def make(name: str, *, image: str = DOCKER_IMAGE, ledger: Path | None = None,
         gpu: str | None = None, mps_pipe: Path | None = None) -> Runner:
    if name == "process":
        return Runner()
    if name == "namespace":
        return NamespaceRunner()
    if name == "docker":
        assert ledger is not None
        return DockerRunner(image, ledger, gpu, mps_pipe)
    raise RunnerError(f"--runner {name!r}: accepted {', '.join(RUNNERS)}")
