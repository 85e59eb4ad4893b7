"""Build hook: the package list, and ``memgov-autoenable.pth`` in site-packages. The rest is in
pyproject.toml.

Packages are discovered, so a new subpackage of memgov ships without an edit here: ``memgov`` and
``memgov.*``, the framework adapters (``adapters/<name>`` installed as ``memgov_<name>``), and every
experiment folder with an ``experiment.toml`` under ``experiments/`` as package data of
``memgov.experiments.<name>`` (so ``memgov pack mnist`` works outside a checkout, see
memgov/pack/manifest.py). tests/auto/test_install.py builds a wheel and runs it in a fresh venv.

Python runs every ``import`` line of a ``.pth`` file in site-packages at start-up. This one line
checks a handful of environment variables and stops there unless one is set (MEMGOV_CLAIM or a GPU
scheduler's budget variable); only then does it import ``memgov._autoenable``, which governs the
program at its first ``import torch`` / ``tensorflow`` / ``jax`` (docs/auto-enable.md).

setuptools has no option for a file at the root of site-packages, so ``build_py`` writes it:
- wheels (``pip install .``): into ``build_lib``, whose whole tree ``install_lib`` puts in the
  wheel's root, which pip unpacks into site-packages;
- editable wheels (``pip install -e .``, PEP 660): setuptools drops ``build_lib`` and packs the
  ``install_lib`` folder it configured for the editable wheel, so the file goes there.
tests/auto/test_install.py checks both in fresh virtual environments.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

PTH_NAME = "memgov-autoenable.pth"
HERE = Path(__file__).resolve().parent
# The line comes from memgov's settings table (the variables that wake auto-enable), imported
# from this source tree: memgov/__init__.py and memgov/_base/settings.py load only the standard
# library and memgov's errors and sizes.
sys.path.insert(0, str(HERE))
from memgov._base.settings import pth_line  # noqa: E402

PTH_LINE = pth_line()


class build_py_with_pth(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            target = self.get_finalized_command("install").install_lib
        else:
            target = self.build_lib
        os.makedirs(target, exist_ok=True)
        with open(os.path.join(target, PTH_NAME), "w", encoding="utf-8") as out:
            out.write(PTH_LINE)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        outputs = list(super().get_outputs(include_bytecode))
        if not getattr(self, "editable_mode", False):
            outputs.append(os.path.join(self.build_lib, PTH_NAME))
        return outputs


ADAPTERS = {
    f"memgov_{p.name}": f"adapters/{p.name}"
    for p in sorted(HERE.glob("adapters/*/"))
    if (p / "__init__.py").is_file()
}
EXPERIMENTS = {
    f"memgov.experiments.{p.parent.name}": f"experiments/{p.parent.name}"
    for p in sorted(HERE.glob("experiments/*/experiment.toml"))
}
EXPERIMENT_DATA = ["*.toml", "*.md", "data/*"]


setup(
    packages=[*find_packages(include=["memgov", "memgov.*"]), *ADAPTERS, *EXPERIMENTS],
    package_dir={**ADAPTERS, **EXPERIMENTS},
    # PEP 561: memgov and its adapters ship their type hints (py.typed).
    package_data={"": ["py.typed"], **{name: EXPERIMENT_DATA for name in EXPERIMENTS}},
    cmdclass={"build_py": build_py_with_pth},
)
