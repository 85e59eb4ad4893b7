"""An experiment's manifest (``experiment.toml``): how pack starts one job and reads its reports.

    [experiment]
    name = "mnist"                  # letters, digits, "_", "-", "." (names the history key)
    description = "..."             # optional
    samples_per_epoch = 60000       # optional
    report = "jsonl-stdout"         # the only protocol pack reads (experiments/mnist/README.md)
    rogue_args = ["--hog-mib", "{mib}"]   # optional (this is the default): what --rogue adds

    [defaults]                      # optional; pack's --epochs/--batch override them
    epochs = 5
    batch = 32

    [cpu]                           # optional: what --device cpu runs unless told otherwise
    epochs = 2                      # instead of [defaults] epochs, when --epochs is not given
    args = ["--limit", "1000"]      # trainer arguments, when none are given after --

    [frameworks.torch]              # one table per framework
    command = ["{python}", "train_torch.py", "--epochs", "{epochs}", "--batch", "{batch}",
               "--device", "{device}"]
    env = { SOME_VAR = "value" }    # optional, added to the job's environment

Commands run with the manifest's folder as working directory.

Bundled experiments (``memgov pack mnist``): the experiments/ folders of the repository ship in the
wheel as ``memgov/experiments/<name>/``; a name that is not an existing path is looked up there (or,
in a checkout, in the repository's experiments/). A folder of that name in the working directory
wins over the bundled one.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memgov._base.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: tomli, the same parser (a dependency there: pyproject.toml)
    try:
        import tomli as tomllib
    except ModuleNotFoundError:  # an install that skipped dependencies: load() says so
        tomllib = None

FILE = "experiment.toml"
PLACEHOLDERS = ("python", "epochs", "batch", "device")
DEFAULT_ROGUE = ("--hog-mib", "{mib}")
REPORTS = ("jsonl-stdout",)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_FIELD = re.compile(r"\{([^{}]*)\}")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_TOP = {"experiment", "defaults", "cpu", "frameworks"}
_EXPERIMENT_KEYS = {"name", "description", "samples_per_epoch", "report", "rogue_args"}
_FRAMEWORK_KEYS = {"command", "env"}


class ManifestError(ConfigError):
    """An experiment folder or manifest pack cannot use; says what is accepted."""

    __module__ = "memgov.pack"  # raised by pack, importable from memgov.pack


@dataclass(frozen=True)
class Framework:
    name: str
    command: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Manifest:
    path: Path
    folder: Path
    name: str
    description: str
    samples_per_epoch: int | None
    report: str
    epochs: int | None
    batch: int | None
    frameworks: dict[str, Framework]
    rogue_args: tuple[str, ...] = DEFAULT_ROGUE
    cpu_epochs: int | None = None
    cpu_args: tuple[str, ...] = ()

    def uses(self, framework: str, placeholder: str) -> bool:
        return any(placeholder in _FIELD.findall(a) for a in self.framework(framework).command)

    def rogue(self, mib: int) -> list[str]:
        return [a.replace("{mib}", str(mib)) for a in self.rogue_args]

    def framework(self, name: str) -> Framework:
        found = self.frameworks.get(name)
        if found is None:
            raise ManifestError(
                f"{self.path}: no [frameworks.{name}] table; this experiment has "
                + ", ".join(sorted(self.frameworks))
            )
        return found

    def command(
        self, framework: str, *, python: str, epochs: int, batch: int, device: str
    ) -> list[str]:
        """The job's argv, placeholders filled in."""
        values = {"python": python, "epochs": str(epochs), "batch": str(batch), "device": device}
        return [
            _FIELD.sub(lambda m: values[m.group(1)], arg)
            for arg in self.framework(framework).command
        ]


def bundled() -> dict[str, Path]:
    """The experiments shipped with memgov, by name -> folder.

    A wheel installs them as memgov/experiments/<name>; a checkout (editable install) has them in
    the repository's experiments/ beside the memgov package."""
    package = Path(__file__).resolve().parents[1]
    for root in (package / "experiments", package.parent / "experiments"):
        found = {p.parent.name: p.parent for p in sorted(root.glob(f"*/{FILE}"))}
        if found:
            return found
    return {}


def locate(target: str | Path) -> Path:
    """The manifest file of an experiment folder (or the file itself, or a bundled name)."""
    path = Path(target).expanduser()
    if not path.exists() and len(path.parts) == 1 and str(target) in bundled():
        path = bundled()[str(target)]
    if path.is_dir():
        path = path / FILE
    if not path.is_file():
        names = ", ".join(bundled()) or "none installed"
        raise ManifestError(
            f"{target}: not an experiment; accepted a folder containing {FILE}, the path of "
            f"such a file, or the name of a bundled experiment ({names})"
        )
    return path.resolve()


def load(target: str | Path) -> Manifest:
    path = locate(target)
    if tomllib is None:
        raise ManifestError(
            f"{path}: reading TOML on Python 3.10 needs tomli, a dependency of memgov-gpu "
            "there that is not installed: pip install 'tomli>=1.1'"
        )
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ManifestError(f"{path}: cannot read it: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ManifestError(f"{path}: not valid TOML: {exc}") from None
    return _parse(path, data)


def _parse(path: Path, data: dict[str, Any]) -> Manifest:
    def fail(message: str) -> ManifestError:
        return ManifestError(f"{path}: {message}")

    unknown = set(data) - _TOP
    if unknown:
        raise fail(f"unknown table(s) {sorted(unknown)}; accepted {sorted(_TOP)}")
    exp = data.get("experiment")
    if not isinstance(exp, dict):
        raise fail('missing [experiment] table (with at least name = "...")')
    _no_unknown(exp, _EXPERIMENT_KEYS, "[experiment]", fail)
    name = exp.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise fail(f"[experiment] name = {name!r}: accepted 1-64 letters, digits, '_', '-', '.'")
    description = exp.get("description", "")
    if not isinstance(description, str):
        raise fail("[experiment] description must be a string")
    samples = exp.get("samples_per_epoch")
    if samples is not None and not _positive_int(samples):
        raise fail(f"[experiment] samples_per_epoch = {samples!r}: accepted a whole number >= 1")
    report = exp.get("report", REPORTS[0])
    if report not in REPORTS:
        raise fail(f"[experiment] report = {report!r}: accepted {', '.join(REPORTS)}")
    rogue = exp.get("rogue_args", list(DEFAULT_ROGUE))
    if (
        not isinstance(rogue, list)
        or not rogue
        or not all(isinstance(a, str) for a in rogue)
        or not any("{mib}" in a for a in rogue)
    ):
        raise fail(
            f"[experiment] rogue_args = {rogue!r}: accepted a list of strings with a "
            '{mib} placeholder, e.g. ["--hog-mib", "{mib}"]'
        )
    defaults = data.get("defaults", {})
    if not isinstance(defaults, dict):
        raise fail("[defaults] must be a table")
    _no_unknown(defaults, {"epochs", "batch"}, "[defaults]", fail)
    for key in ("epochs", "batch"):
        if key in defaults and not _positive_int(defaults[key]):
            raise fail(f"[defaults] {key} = {defaults[key]!r}: accepted a whole number >= 1")
    cpu = data.get("cpu", {})
    if not isinstance(cpu, dict):
        raise fail("[cpu] must be a table")
    _no_unknown(cpu, {"epochs", "args"}, "[cpu]", fail)
    if "epochs" in cpu and not _positive_int(cpu["epochs"]):
        raise fail(f"[cpu] epochs = {cpu['epochs']!r}: accepted a whole number >= 1")
    cpu_args = cpu.get("args", [])
    if not isinstance(cpu_args, list) or not all(isinstance(a, str) for a in cpu_args):
        raise fail(f"[cpu] args = {cpu_args!r}: accepted a list of strings")
    tables = data.get("frameworks")
    if not isinstance(tables, dict) or not tables:
        raise fail(
            "missing [frameworks.<name>] tables, e.g. [frameworks.torch] with "
            'command = ["{python}", "train.py"]'
        )
    frameworks = {fw: _framework(fw, table, fail) for fw, table in tables.items()}
    return Manifest(
        path=path,
        folder=path.parent,
        name=name,
        description=description,
        samples_per_epoch=samples,
        report=report,
        epochs=defaults.get("epochs"),
        batch=defaults.get("batch"),
        frameworks=frameworks,
        rogue_args=tuple(rogue),
        cpu_epochs=cpu.get("epochs"),
        cpu_args=tuple(cpu_args),
    )


def _framework(name: str, table: object, fail: Any) -> Framework:
    where = f"[frameworks.{name}]"
    if not _NAME.match(name):
        raise fail(f"{where}: framework names are letters, digits, '_', '-', '.'")
    if not isinstance(table, dict):
        raise fail(f"{where} must be a table with command = [...]")
    _no_unknown(table, _FRAMEWORK_KEYS, where, fail)
    command = table.get("command")
    if (
        not isinstance(command, list)
        or not command
        or not all(isinstance(a, str) and a for a in command)
    ):
        raise fail(
            f"{where} command: accepted a non-empty list of non-empty strings, e.g. "
            '["{python}", "train.py", "--epochs", "{epochs}"]'
        )
    for arg in command:
        for used in _FIELD.findall(arg):
            if used not in PLACEHOLDERS:
                raise fail(
                    f"{where} command: unknown placeholder {{{used}}} in {arg!r}; "
                    f"accepted {', '.join('{' + p + '}' for p in PLACEHOLDERS)}"
                )
    env = table.get("env", {})
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and _ENV_NAME.match(k) and isinstance(v, str) for k, v in env.items()
    ):
        raise fail(f'{where} env: accepted a table of NAME = "value" strings')
    return Framework(name, tuple(command), dict(env))


def _no_unknown(table: dict[str, Any], known: set[str], where: str, fail: Any) -> None:
    unknown = set(table) - known
    if unknown:
        raise fail(f"{where}: unknown key(s) {sorted(unknown)}; accepted {sorted(known)}")


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1
