"""Fixtures shared by every test: a private ledger folder always, simulated GPUs on request.

Also the ``env`` and ``py`` fixtures of the auto-enable and adapter tests: real interpreters
started with a private ledger and a clean environment.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import host_changes
from tests.helpers.procs import Child


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        host_changes.OPTION,
        action="store_true",
        default=False,
        help="also run the tests that change the host: they apt-get install docker.io and "
        "debootstrap, start Docker engines and keep their images, create users "
        f"(README, 'Set up and test'); {host_changes.SETTING}=1 does the same",
    )


SESSION_CACHES = {
    "XDG_CACHE_HOME": "cache",  # pip, matplotlib's font list, the MNIST arrays (memgov)
    "MPLCONFIGDIR": "matplotlib",
    "KERAS_HOME": "keras",
    "TORCHINDUCTOR_CACHE_DIR": "torchinductor",  # else /tmp/torchinductor_<user>, kept
    "RAY_TMPDIR": "ray",  # else /tmp/ray, kept (a short path: Ray's socket paths must fit)
}
"""Where tools would write into the home folder or /tmp and keep it: this session's folder."""
SESSION_KEY = pytest.StashKey[Path]()
EXIT_KEY = pytest.StashKey[int]()


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """One temporary folder for the whole session, pytest's own base folder included, removed at
    the end (kept, and named, when a test failed or the run was interrupted): a test run leaves
    no folder in /tmp or the home folder. A --basetemp of the user's is theirs to keep."""
    host_changes.allowed(config)  # a bad MEMGOV_TEST_HOST_CHANGES stops here, before any folder
    _interruptible_children()
    _terminate_like_interrupt()
    _triton_before_tensorflow()
    if getattr(config, "workerinput", None) is not None or config.option.basetemp:
        return
    session = Path(tempfile.mkdtemp(prefix="memgov-tests-"))
    config.option.basetemp = str(session / "pytest")
    config.stash[SESSION_KEY] = session
    for name, folder in SESSION_CACHES.items():
        if name not in os.environ:
            os.environ[name] = str(session / folder)
    # What the tests' processes put in the temporary folder (TensorFlow's autograph writes its
    # generated modules there) or in the default ledger (a process started without the test's
    # MEMGOV_DIR) lands in this session's folder, not in /tmp: a fresh user's run left
    # /tmp/__pycache__/__autograph_generated_file*.pyc and /tmp/memgov-ledger/v1/_profiles.
    # Each test still gets its own MEMGOV_DIR (the private_ledger fixture below).
    (session / "tmp").mkdir()
    (session / "tmp").chmod(0o1777)
    os.environ["TMPDIR"] = str(session / "tmp")
    os.environ["MEMGOV_DIR"] = str(session / "ledger-default")  # made by memgov if ever used


def _triton_before_tensorflow() -> None:
    """TensorFlow 2.20 and later load their library with RTLD_GLOBAL, putting its statically
    linked LLVM in the global symbol table; triton's libtriton, loaded after it, binds to that copy
    and crashes the interpreter (tensorflow/tensorflow#124205: `import tensorflow; import triton`
    segfaults, the other order does not). torch imports triton lazily (torch._dynamo) on its CUDA
    builds, which in this session comes after the adapter tests imported TensorFlow: a fresh
    plain user whose pip installed torch's CUDA build lost the whole run at 44% to it. Where both
    are installed, triton is loaded first, the order that works (the CPU build has no triton)."""
    from importlib.util import find_spec

    if find_spec("triton") is None or find_spec("tensorflow") is None:
        return
    # A triton that cannot load here is one torch cannot use either: nothing to keep in order.
    with contextlib.suppress(Exception):
        import triton  # noqa: F401  (loaded for its side effect: first in the symbol table)


def _interruptible_children() -> None:
    """A test run started in the background of a shell without job control (`cmd &` in a
    script, nohup) inherits SIGINT ignored, and so would every process a test starts: the tests
    of Ctrl-C would then find it ignored, not memgov. A Python handler here is reset to the
    default in each child at exec, so the children get Ctrl-C as from a terminal."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _terminate_like_interrupt() -> None:
    """SIGTERM (a CI timeout, `kill`) ends the session as Ctrl-C does: with its teardown, so the
    engines, users and folders its fixtures made go, where the default action would leave them
    (the next session still removes a killed one's engines: tests/docker/leftovers.py). A
    process forked from this one (a test's child) keeps the default: it dies by the signal."""
    session = os.getpid()

    def interrupt(signum: int, _frame: object) -> None:
        if os.getpid() != session:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        raise KeyboardInterrupt(f"signal {signum}")

    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, interrupt)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    session.config.stash[EXIT_KEY] = int(exitstatus)


KEEP_VAR = "MEMGOV_TEST_KEEP"
"""Set to 1: the session's temporary folder is kept (and named) instead of removed."""


def pytest_unconfigure(config: pytest.Config) -> None:
    folder = config.stash.get(SESSION_KEY, None)
    if folder is None:
        return
    failed = config.stash.get(EXIT_KEY, 0) in (
        pytest.ExitCode.TESTS_FAILED,
        pytest.ExitCode.INTERRUPTED,
    )
    # The test command leaves the machine as it found it, failed or not, unless asked to keep
    # what a failure left for a look.
    if os.environ.get(KEEP_VAR) == "1":
        sys.stderr.write(f"memgov tests: temporary files kept for inspection in {folder}\n")
        return
    shutil.rmtree(folder, ignore_errors=True)
    if failed:
        sys.stderr.write(f"memgov tests: temporary files removed; {KEEP_VAR}=1 keeps them\n")


def pytest_report_header(config: pytest.Config) -> str:
    if host_changes.allowed(config):
        return "host changes: allowed (tests marked host_changes run)"
    return f"host changes: none (tests marked host_changes skip; {host_changes.OPTION} runs them)"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test that changes the host (itself or through a fixture); skip it unless asked."""
    allowed = host_changes.allowed(config)
    for item in items:
        what = host_changes.what_it_does(item)
        if what is None:
            continue
        if item.get_closest_marker(host_changes.MARKER) is None:
            item.add_marker(pytest.mark.host_changes(what))
        if not allowed:
            item.add_marker(pytest.mark.skip(reason=host_changes.skip_reason(what)))


@pytest.fixture(autouse=True)
def private_ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own MEMGOV_DIR, so no test ever touches the host's real ledger."""
    path = tmp_path / "ledger"
    monkeypatch.setenv("MEMGOV_DIR", str(path))
    # The thread variables too: an in-process claim sets them (memgov/_cpu/threads.py), and
    # monkeypatch removes them again after the test, so no later test inherits them.
    for name in (
        "MEMGOV_RESERVE",
        "MEMGOV_THREADS",
        "MEMGOV_HOLDER",
        "MEMGOV_THREADS_SET",
        "MEMGOV_ENV_SET",
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
        "VECLIB_MAXIMUM_THREADS",
        "NUMEXPR_NUM_THREADS",
    ):
        monkeypatch.delenv(name, raising=False)
    # Names this process knew dead are kept by folder inode, which a later test's folder may
    # reuse: harmless for live records (a record's name is never reused), not for a test that
    # plants files under fixed names and expects them reported.
    from memgov._ledger import deadnames as _deadnames

    _deadnames.forget()
    return path


@pytest.fixture
def sim(monkeypatch: pytest.MonkeyPatch) -> str:
    """One simulated 64 GiB GPU named sim0 (tests that need another layout set MEMGOV_DEVICES)."""
    monkeypatch.setenv("MEMGOV_DEVICES", "sim0:64GiB")
    return "sim0"


@pytest.fixture
def shared_ledger(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A ledger folder other users can reach (pytest's tmp_path is private: mode 0700)."""
    base = Path(tempfile.mkdtemp(prefix="memgov-test-", dir="/tmp"))
    base.chmod(0o1777)  # like /tmp: whoever claims first creates the ledger folder
    monkeypatch.setenv("MEMGOV_DIR", str(base / "ledger"))
    yield base / "ledger"
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(autouse=True)
def _release_claim_held_by_test() -> Iterator[None]:
    """A test that fails while holding an in-process claim must not leak it into the next test."""
    yield
    claim_module = sys.modules.get("memgov._claim")
    held = claim_module.current() if claim_module is not None else None
    if held is not None:
        held.release()


# Settings a child interpreter must not inherit from the shell that runs the tests.
CLEARED_PREFIXES = (
    "MEMGOV_",
    "CUDA_DEVICE_MEMORY_LIMIT",
    "ALIYUN_COM_GPU_MEM",
    "GPU_MEMORY_LIMIT",
    "GPU_PORTION",
    "RUNAI_NUM_OF_GPUS",
    "NVIDIA_GPU_MEMORY_",
    "PYTORCH_ALLOC_CONF",
    "PYTORCH_CUDA_ALLOC_CONF",
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
    "SLURM_SHARDS_ON_NODE",
    "XLA_",
    "TF_FORCE_GPU_ALLOW_GROWTH",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """A clean environment: private ledger, one simulated 16 GiB GPU, no memgov settings."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(CLEARED_PREFIXES)}
    clean.update(MEMGOV_DIR=str(tmp_path / "ledger"), MEMGOV_DEVICES="sim0:16GiB")
    clean["JAX_PLATFORMS"] = "cpu"
    clean["TF_CPP_MIN_LOG_LEVEL"] = "3"
    return clean


Run = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def py() -> Run:
    """Run ``python -c CODE`` (this venv's interpreter, so its memgov-autoenable.pth) with ENV."""

    def run(code: str, env: dict[str, str], timeout: float = 180) -> Any:
        return subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout
        )

    return run


@pytest.fixture
def children() -> Iterator[list[Child]]:
    """Child claimers a test starts (append them); each is closed when the test ends."""
    started: list[Child] = []
    yield started
    for child in started:
        child.close()
