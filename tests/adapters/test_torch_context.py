"""The torch adapter's background CUDA context, against a stand-in for the CUDA driver.

The driver here is a small C library with the five calls ``memgov_torch._context`` makes; its
``cuDevicePrimaryCtxRetain`` takes a while, as a context under MPS does with many processes
starting. What is checked: the context is made on the claimed device (matched by UUID), the
script's own Python runs on while it is made (ctypes lets go of the GIL), a fork waits for it and
the child is marked as torch marks a child of a process that initialised CUDA, and
MEMGOV_TORCH_WARM=off makes none. On the GPU machine: benchmarks/gpu/torch_warm.py.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from memgov_torch._context import uuid_text

FAKE_DRIVER = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void note(const char *what, int value) {
    const char *path = getenv("FAKE_CUDA_LOG");
    FILE *f = path ? fopen(path, "a") : NULL;
    if (f) { fprintf(f, "%s %d\n", what, value); fclose(f); }
}
int cuInit(unsigned flags) { note("init", (int)flags); return 0; }
int cuDeviceGetCount(int *count) { *count = 2; return 0; }
int cuDeviceGet(int *device, int ordinal) { *device = ordinal; return 0; }
int cuDeviceGetUuid(unsigned char *uuid, int device) {
    memset(uuid, 0, 16); uuid[15] = (unsigned char)(device + 1); return 0;
}
int cuDevicePrimaryCtxRetain(void **context, int device) {
    usleep(atoi(getenv("FAKE_CUDA_RETAIN_MS")) * 1000);
    *context = (void *)0x1; note("retain", device); return 0;
}
"""

SECOND_DEVICE = "GPU-00000000-0000-0000-0000-000000000002"


@pytest.fixture(scope="module")
def fake_driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build the stand-in CUDA driver")
    folder = tmp_path_factory.mktemp("fake-cuda")
    (folder / "fake.c").write_text(FAKE_DRIVER)
    library = folder / "libcuda-fake.so"
    subprocess.run(
        [compiler, "-shared", "-fPIC", "-o", str(library), str(folder / "fake.c")], check=True
    )
    return library


def run(
    code: str, driver: Path, log: Path, retain_ms: int = 600, env: dict[str, str] | None = None
) -> dict[str, Any]:
    prelude = (
        "import json, os, sys, time, threading\n"
        "import torch\n"
        "from memgov_torch import _context\n"
        f"_context.DRIVER = {str(driver)!r}\n"
    )
    env = {
        "FAKE_CUDA_LOG": str(log),
        "FAKE_CUDA_RETAIN_MS": str(retain_ms),
        "PATH": "/usr/bin",
        **(env or {}),
    }
    out = subprocess.run(
        [sys.executable, "-c", prelude + code], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_drivers_uuid_bytes_read_as_nvml_writes_them() -> None:
    raw = bytes.fromhex("8f1a2b3c4d5e6f708192a3b4c5d6e7f8")
    assert uuid_text(raw) == "GPU-8f1a2b3c-4d5e-6f70-8192-a3b4c5d6e7f8"


def test_the_context_is_made_on_the_claimed_device_while_the_script_runs_on(
    fake_driver: Path, tmp_path: Path
) -> None:
    log = tmp_path / "driver.log"
    result = run(
        f"t0 = time.time(); started = _context.start({SECOND_DEVICE!r})\n"
        "spins = 0\n"
        "while time.time() - t0 < 0.3:\n"  # the script's own set-up, in Python
        "    spins += 1\n"
        "during = _context._state['thread'].is_alive()\n"
        "_context.wait()\n"
        "print(json.dumps({'started': started, 'spins': spins, 'alive_during': during,\n"
        "                  'made': _context.made(), 'again': _context.start('x'),\n"
        "                  'torch_initialised': torch.cuda.is_initialized()}))\n",
        fake_driver,
        log,
    )
    assert result["started"] is True and result["made"] is True
    assert result["alive_during"] is True  # the context was still being made ...
    assert int(result["spins"]) > 100_000  # ... while the main thread ran Python freely
    assert result["again"] is False  # once per process
    assert result["torch_initialised"] is False  # torch's own state is left to torch
    assert log.read_text().split("\n")[:2] == ["init 0", "retain 1"]


def test_a_device_the_driver_does_not_list_gets_no_context(
    fake_driver: Path, tmp_path: Path
) -> None:
    log = tmp_path / "driver.log"
    result = run(
        "_context.start('GPU-ffffffff-0000-0000-0000-000000000000'); _context.wait()\n"
        "print(json.dumps({'made': _context.made()}))\n",
        fake_driver,
        log,
    )
    assert result["made"] is False
    assert "retain" not in log.read_text()


def test_no_driver_no_context_and_no_noise(tmp_path: Path) -> None:
    result = run(
        f"_context.start({SECOND_DEVICE!r}); _context.wait()\n"
        "print(json.dumps({'made': _context.made()}))\n",
        tmp_path / "no-such-libcuda.so",
        tmp_path / "driver.log",
    )
    assert result["made"] is False


def test_a_fork_waits_for_the_context_and_its_child_cannot_use_cuda(
    fake_driver: Path, tmp_path: Path
) -> None:
    result = run(
        f"_context.start({SECOND_DEVICE!r}); t0 = time.time()\n"
        "r, w = os.pipe(); pid = os.fork()\n"
        "if pid == 0:\n"
        "    try:\n"
        "        torch.cuda._lazy_init(); said = 'initialised'\n"
        "    except Exception as exc:\n"
        "        said = str(exc)\n"
        "    os.write(w, said.encode()); os._exit(0)\n"
        "forked_after = time.time() - t0\n"
        "os.close(w); child = os.read(r, 500).decode(); os.waitpid(pid, 0)\n"
        "print(json.dumps({'forked_after': forked_after, 'made': _context.made(),\n"
        "                  'child': child}))\n",
        fake_driver,
        tmp_path / "driver.log",
    )
    assert float(result["forked_after"]) >= 0.5  # the fork waited for the 0.6 s context
    assert result["made"] is True
    assert "Cannot re-initialize CUDA in forked subprocess" in str(result["child"])


def test_a_child_forked_without_a_context_keeps_torchs_own_answer(tmp_path: Path) -> None:
    # No driver here: nothing was initialised, so the child is not marked (on this CPU build
    # torch then says it has no CUDA, as it would without memgov).
    result = run(
        f"_context.start({SECOND_DEVICE!r}); _context.wait()\n"
        "r, w = os.pipe(); pid = os.fork()\n"
        "if pid == 0:\n"
        "    try:\n"
        "        torch.cuda._lazy_init(); said = 'initialised'\n"
        "    except BaseException as exc:\n"
        "        said = str(exc)\n"
        "    os.write(w, said.encode()); os._exit(0)\n"
        "os.close(w); child = os.read(r, 500).decode(); os.waitpid(pid, 0)\n"
        "print(json.dumps({'child': child}))\n",
        tmp_path / "no-such-libcuda.so",
        tmp_path / "driver.log",
    )
    assert "forked subprocess" not in str(result["child"])


@pytest.mark.parametrize("warm", ["on", "off"])
def test_the_adapter_starts_the_context_unless_memgov_torch_warm_is_off(
    fake_driver: Path, tmp_path: Path, warm: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEMGOV_TORCH_WARM", warm)
    log = tmp_path / "driver.log"
    result = run(
        "from memgov_torch import TorchAdapter\n"
        "from memgov.adapter import Budget\n"
        f"budget = Budget(2**30, {SECOND_DEVICE!r}, 80 * 2**30, 1, False, 'test')\n"
        "report = TorchAdapter().apply(budget); _context.wait()\n"
        "print(json.dumps({'report': report, 'made': _context.made(),\n"
        "                  'queued': len(torch.cuda._queued_calls)}))\n",
        fake_driver,
        log,
        retain_ms=10,
        env={"MEMGOV_TORCH_WARM": warm},
    )
    assert result["made"] is (warm == "on")
    assert ("CUDA context being made in the background" in str(result["report"])) is (warm == "on")
    assert "allocator cap from 1.00 GiB when CUDA initialises" in str(result["report"])
