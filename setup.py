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
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

PTH_NAME = "memgov-autoenable.pth"
# Keep the variable names in step with memgov._autoenable.TRIGGERS (a test compares them).
PTH_LINE = (
    "import os; any(k.startswith(('MEMGOV_CLAIM', 'CUDA_DEVICE_MEMORY_LIMIT', "
    "'ALIYUN_COM_GPU_MEM_CONTAINER', 'GPU_PORTION', 'NVIDIA_GPU_MEMORY_', "
    "'CUDA_MPS_PINNED_DEVICE_MEM_LIMIT', 'SLURM_SHARDS_ON_NODE')) for k in os.environ) and "
    "__import__('memgov._autoenable')._autoenable.start()\n"
)


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


HERE = Path(__file__).resolve().parent
ADAPTERS = {f"memgov_{p.name}": f"adapters/{p.name}" for p in sorted(HERE.glob("adapters/*/"))
            if (p / "__init__.py").is_file()}
EXPERIMENTS = {f"memgov.experiments.{p.parent.name}": f"experiments/{p.parent.name}"
               for p in sorted(HERE.glob("experiments/*/experiment.toml"))}
EXPERIMENT_DATA = ["*.toml", "*.md", "data/*"]


setup(
    packages=[*find_packages(include=["memgov", "memgov.*"]), *ADAPTERS, *EXPERIMENTS],
    package_dir={**ADAPTERS, **EXPERIMENTS},
    # PEP 561: memgov and its adapters ship their type hints (py.typed).
    package_data={"": ["py.typed"], **{name: EXPERIMENT_DATA for name in EXPERIMENTS}},
    cmdclass={"build_py": build_py_with_pth},
)
