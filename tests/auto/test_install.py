"""Installs outside the checkout: the .pth reaches site-packages with `pip install .` and
`pip install -e .`, and a wheel built from the checkout works on its own (fresh venvs)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from memgov import _autoenable
from memgov._base import settings as _settings

REPO = Path(__file__).resolve().parents[2]
DISTRIBUTION = "memgov-gpu"


def site_packages(venv: Path) -> Path:
    return next((venv / "lib").glob("python3*/site-packages"))


def pip(venv: Path, *args: str) -> None:
    result = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "-q", *args],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    if result.returncode != 0:
        pytest.fail(f"pip {' '.join(args)} failed:\n{result.stdout}\n{result.stderr[-3000:]}")


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, timeout=120)
    return path


def started(venv: Path) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMGOV_")}
    env["MEMGOV_CLAIM"] = "1GiB"
    code = "import sys; m = sys.modules.get('memgov._autoenable'); print(m and m._state)"
    result = subprocess.run(
        [str(venv / "bin" / "python"), "-c", code], env=env, capture_output=True, text=True,
        timeout=60, cwd="/",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@pytest.mark.parametrize("editable", [False, True], ids=["wheel", "editable"])
def test_pth_installed_runs_and_is_removed(venv, editable):
    pth = site_packages(venv) / _autoenable.PTH_NAME
    pip(venv, "install", "--no-deps", *(["-e"] if editable else []), str(REPO))
    assert pth.is_file()
    line = pth.read_text()
    assert line.startswith("import os;") and line.count("\n") == 1
    assert line == _settings.pth_line()  # built from the settings table
    assert set(re.findall(r"'([A-Z_]+)'", line)) == set(_settings.TRIGGERS)
    # The .pth wakes auto-enable (its import hooks only: nothing else is imported).
    assert started(venv) == "{'started': True, 'fired': False}"
    pip(venv, "uninstall", "-y", DISTRIBUTION)
    assert not pth.exists()
    assert started(venv) == "None"


# -- a wheel, installed non-editable in a fresh venv, used outside the checkout --------------

OWN = ("memgov", "memgov_", "__editable__", "memgov-", "memgov_gpu")
"""Entries of this venv's site-packages that are memgov's own: never lent to the fresh venv."""


def lend_third_party(fresh: Path) -> None:
    """Make this venv's third-party packages (torch, numpy, typer...) importable in ``fresh``.

    Installing the CPU torch wheel again costs ~45 s on a 2-core machine, so the fresh venv gets a
    folder of symlinks to every package here except memgov's own entries, through a .pth line
    (Python adds that folder to sys.path; its own .pth files are not run). memgov itself comes
    only from the wheel: pip sees the lent packages and resolves the wheel's dependencies
    against them, so the wheel's metadata is checked too.
    """
    here = Path(next(p for p in sys.path if p.endswith("site-packages")))
    farm = fresh / "lent"
    farm.mkdir()
    for entry in here.iterdir():
        if entry.name.startswith(OWN) or entry.suffix == ".pth" or entry.name == "__pycache__":
            continue
        (farm / entry.name).symlink_to(entry)
    (site_packages(fresh) / "lent-third-party.pth").write_text(f"{farm}\n")


def test_wheel_outside_checkout_runs_version_and_cpu_pack(tmp_path):
    wheels = tmp_path / "wheels"
    pip_run = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    built = subprocess.run(
        [*pip_run, "wheel", "--no-deps", "-w", str(wheels), str(REPO)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = wheels.glob("memgov_gpu-*.whl")
    fresh = tmp_path / "fresh"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(fresh)], check=True, timeout=120
    )
    lend_third_party(fresh)
    python = fresh / "bin" / "python"
    # pip of this venv, installing into the fresh one (the fresh venv has no pip of its own).
    installed = subprocess.run(
        [*pip_run, "--python", str(python), "install", str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr[-3000:]

    work = tmp_path / "elsewhere"  # outside the checkout: no experiments/ folder to find
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEMGOV_", "PYTHON"))}
    env.update(MEMGOV_DIR=str(tmp_path / "ledger"), PATH=f"{fresh / 'bin'}:{env['PATH']}")

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(argv), capture_output=True, text=True, timeout=240, cwd=work, env=env
        )

    where = run(str(python), "-c", "import memgov, memgov.pack; print(memgov.__file__)")
    assert where.returncode == 0, where.stderr
    assert where.stdout.startswith(str(site_packages(fresh) / "memgov")), where.stdout
    assert not where.stdout.startswith(str(REPO))

    memgov = str(fresh / "bin" / "memgov")
    version = run(memgov, "--version")
    assert version.returncode == 0, version.stderr
    assert version.stdout.startswith("memgov 0.") and str(site_packages(fresh)) in version.stdout
    # The command line is a package of its own (memgov/cli/): every way in must find it.
    assert (site_packages(fresh) / "memgov" / "cli" / "__init__.py").is_file()
    for way in ([str(python), "-m", "memgov"], [str(python), "-m", "memgov.cli"]):
        listed = run(*way, "devices", "--json")
        assert listed.returncode == 0 and '"devices"' in listed.stdout, listed.stderr

    def pack(out: Path, *options: str) -> dict:
        """A two-job CPU pack of the bundled mnist from the installed command; its report."""
        small = ("--device", "cpu", "--n", "2", "--epochs", "1", "--no-solo", "--no-progress")
        trainer = ("--limit", "256", "--eval-limit", "64")
        packed = run(memgov, "pack", *small, *options, "--out", str(out), "mnist", "--", *trainer)
        assert packed.returncode == 0, packed.stdout + packed.stderr
        return json.loads((out / "report.json").read_text())

    report = pack(tmp_path / "report")
    bundled = site_packages(fresh) / "memgov" / "experiments" / "mnist" / "experiment.toml"
    assert report["manifest"] == str(bundled)
    assert [j["status"] for j in report["jobs"]] == ["ok", "ok"]
    assert all(j["claim_mib"] for j in report["jobs"])  # governed: each job claimed on the ledger

    # --runner preload from the wheel: its zygote and launcher modules ship, and the forked
    # trainers (which never import memgov) are governed as spawned ones are.
    report = pack(tmp_path / "report-preload", "--runner", "preload")
    assert [j["status"] for j in report["jobs"]] == ["ok", "ok"]
    assert all(j["claim_mib"] for j in report["jobs"])
    assert report["runner_details"]["zygote_forked"] == 2, report["runner_details"]


def test_docker_build_context_has_every_file_the_build_reads():
    """examples/docker builds memgov from the files its COPY lines name: the files pyproject.toml
    refers to (readme, license) must be among them, or the image's `pip install` fails."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    needed = {project["readme"], *project["license-files"], "pyproject.toml", "setup.py"}
    copied: set[str] = set()
    for line in (REPO / "examples" / "docker" / "Dockerfile").read_text().splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and words[-1].startswith("/src/memgov"):
            copied.update(words[1:-1])
    assert needed <= copied, needed - copied


def test_ci_runs_exactly_the_readmes_set_up_and_test_commands():
    """The README's two commands, the test one with --host-changes, which the README shows."""
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("## Set up and test") :]
    blocks = [b.split("```")[0].strip() for b in section.split("```bash\n")[1:3]]
    set_up, test = blocks[0].splitlines()
    ci_test = blocks[1].split("#")[0].strip()
    ci = [
        line
        for line in (REPO / ".ci" / "run").read_text().splitlines()
        if line and not line.startswith(("#", "set ", "cd "))
    ]
    assert ci == [set_up, ci_test] and ci_test == f"{test} --host-changes"
