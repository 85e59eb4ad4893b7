"""The import graph keeps its layers (docs/architecture.md): read with ``ast``, no tool, no imports.

Every Python file of the package and the adapters belongs to one layer (first matching pattern in
LAYERS); a file in no layer fails the test, so a new folder gets a rule before it gets code. Each
layer says which memgov layers it may import (anywhere in the file) and which outside modules it
must not import at module level. Imports under ``if TYPE_CHECKING:`` are left out: they never run.
"""

from __future__ import annotations

import ast
import fnmatch
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

FRAMEWORKS = ("torch", "tensorflow", "keras", "jax", "jaxlib", "ray")
CLI_LIBRARIES = ("typer", "click", "rich")
PLOTTING = ("matplotlib", "numpy")


@dataclass(frozen=True)
class Layer:
    name: str
    patterns: tuple[str, ...]
    """Paths relative to the repository root; "*" matches within one folder level."""
    may_import: frozenset[str] | None
    """memgov layers this layer may import; None = any."""
    not_at_module_level: tuple[str, ...] = ()
    """Top-level packages this layer imports only inside functions (cheap, optional, GPU-safe)."""
    memgov_modules: frozenset[str] | None = field(default=None)
    """If set, the only memgov modules it may import at all (the adapters' public contract)."""


WINGS = ("base", "files", "gpu", "ledger", "cpu", "profiles")
"""The core's wings, bottom first (memgov/_<wing>/, docs/architecture.md "The core's wings")."""
WING_IMPORTS = {
    "base": {"base"},
    "files": {"base", "files"},
    "gpu": {"base", "files", "gpu"},
    "ledger": {"base", "files", "gpu", "ledger"},
    # The two top wings stand side by side: neither imports the other.
    "cpu": {"base", "files", "gpu", "ledger", "cpu"},
    "profiles": {"base", "files", "gpu", "ledger", "profiles"},
}
CORE = frozenset({"core", *WINGS})
"""The facade (memgov/*.py, layer "core") and the wings under it: what the tools may import."""
CORE_AND_CONTRACT = frozenset({"core"})
LAYERS = (
    # The command line: typer apps and rich rendering, over everything else (memgov/cli/, one
    # module per command group, and `python -m memgov`).
    Layer("cli", ("memgov/cli/*.py", "memgov/__main__.py"), may_import=None),
    # memgov pack: a library of its own on top of the core (the CLI is a thin layer over it);
    # its runs are a front end of the queue's engine (memgov/queue/engine.py, its policies).
    Layer(
        "pack",
        ("memgov/pack/*.py",),
        may_import=CORE | {"decide", "pack", "queue", "ray"},
        not_at_module_level=FRAMEWORKS + CLI_LIBRARIES + PLOTTING,
    ),
    # The Ray integration (memgov.ray, one module or a folder).
    Layer(
        "ray",
        ("memgov/ray.py", "memgov/ray/*.py"),
        may_import=CORE | {"pack", "ray"},
        not_at_module_level=CLI_LIBRARIES + PLOTTING,
    ),
    # The Prometheus exporter (memgov exporter): the only layer that imports prometheus_client,
    # an optional extra; the cli imports it inside the command.
    Layer(
        "exporter",
        ("memgov/exporter/*.py",),
        may_import=CORE | {"exporter"},
        not_at_module_level=FRAMEWORKS + CLI_LIBRARIES + PLOTTING,
    ),
    # The trace simulator (memgov.placement): a front end of the decision core that replays a
    # cluster trace; the cli imports it inside its commands only.
    Layer(
        "placement",
        ("memgov/placement/*.py",),
        may_import=CORE | {"decide", "placement"},
        not_at_module_level=FRAMEWORKS + CLI_LIBRARIES + ("matplotlib",),
    ),
    # The job queue (memgov.queue): store, runner, shepherd, engine, report. Over the core and the
    # decision core; Ray only inside functions (--ray).
    Layer(
        "queue",
        ("memgov/queue/*.py",),
        may_import=CORE | {"decide", "queue", "ray"},
        not_at_module_level=FRAMEWORKS + CLI_LIBRARIES + PLOTTING,
    ),
    # The decision core (memgov.decide): one policy interface and registry for the queue, pack,
    # Ray and the simulator. Its numpy arrays are its interface (numpy at module level).
    Layer(
        "decide",
        ("memgov/decide/*.py",),
        may_import=CORE | {"decide"},
        not_at_module_level=FRAMEWORKS + CLI_LIBRARIES + ("matplotlib",),
    ),
    # The library: the public facade (memgov/__init__.py, memgov/adapter.py, claim, auto-enable,
    # status, doctor) over the core's wings, each of which imports only the wings under it.
    # Imported in every interpreter that auto-enable governs.
    Layer(
        "core",
        ("memgov/*.py",),
        may_import=CORE,
        not_at_module_level=FRAMEWORKS + CLI_LIBRARIES + PLOTTING,
    ),
    *(
        Layer(
            wing,
            (f"memgov/_{wing}/*.py",),
            may_import=frozenset(WING_IMPORTS[wing]),
            not_at_module_level=FRAMEWORKS + CLI_LIBRARIES + PLOTTING,
        )
        for wing in WINGS
    ),
    # Framework adapters: plugins that see memgov only through its public contract.
    Layer(
        "adapters",
        ("adapters/*.py", "adapters/*/*.py"),
        may_import=CORE_AND_CONTRACT,
        not_at_module_level=FRAMEWORKS,
        memgov_modules=frozenset({"memgov.adapter"}),
    ),
)


def layer_of(relative: str) -> Layer | None:
    for layer in LAYERS:
        if any(_matches(relative, pattern) for pattern in layer.patterns):
            return layer
    return None


def _matches(relative: str, pattern: str) -> bool:
    parts, wanted = relative.split("/"), pattern.split("/")
    return len(parts) == len(wanted) and all(map(fnmatch.fnmatchcase, parts, wanted))


def memgov_layer(module: str) -> str:
    """The layer of an imported memgov module, from its dotted name."""
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in ("cli", "__main__"):
        return "cli"
    if len(parts) > 1 and parts[1] in ("pack", "ray", "exporter", "placement", "queue", "decide"):
        return parts[1]
    if len(parts) > 1 and parts[1].removeprefix("_") in WINGS and parts[1].startswith("_"):
        return parts[1][1:]
    return "core"


def files() -> list[Path]:
    found = [*(ROOT / "memgov").rglob("*.py"), *(ROOT / "adapters").rglob("*.py")]
    return sorted(p for p in found if "__pycache__" not in p.parts)


@dataclass(frozen=True)
class Import:
    module: str
    line: int
    module_level: bool


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports(path: Path) -> list[Import]:
    """Every import in ``path``; ``from memgov import x`` counts as ``memgov.x``."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    found: list[Import] = []

    def visit(node: ast.AST, module_level: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for branch in node.orelse:
                visit(branch, module_level)
            return
        if isinstance(node, ast.Import):
            found.extend(Import(a.name, node.lineno, module_level) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this file's package
                anchor = package.split(".")[: -node.level]
                base = ".".join([*anchor, base] if base else anchor)
            modules = [f"{base}.{a.name}" for a in node.names if _is_module(f"{base}.{a.name}")]
            if base == "memgov" or (modules and len(modules) == len(node.names)):
                # from memgov import x, from memgov._ledger import records: each names a module
                found.extend(
                    Import(f"{base}.{a.name}", node.lineno, module_level) for a in node.names
                )
            else:
                found.append(Import(base, node.lineno, module_level))
        inner = module_level and not isinstance(
            node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
        )
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(ast.parse(path.read_text(encoding="utf-8"), str(path)), True)
    return found


def _is_module(dotted: str) -> bool:
    return (
        dotted.startswith("memgov.")
        and (ROOT / dotted.replace(".", "/")).with_suffix(".py").is_file()
    )


def test_every_file_has_a_layer() -> None:
    lost = [str(p.relative_to(ROOT)) for p in files() if layer_of(str(p.relative_to(ROOT))) is None]
    assert not lost, f"add these to a layer in tests/test_architecture.py LAYERS: {lost}"


def test_the_checker_sees_what_it_must() -> None:
    # The rules below are only as good as the parser: pin its reading of a known file.
    seen = {i.module: i.module_level for i in imports(ROOT / "adapters" / "torch" / "__init__.py")}
    assert seen["memgov.adapter"] is True
    assert seen["torch"] is False  # imported inside apply()
    assert memgov_layer("memgov.pack.plan") == "pack" and memgov_layer("memgov.cli.mps") == "cli"
    assert memgov_layer("memgov.cli") == "cli" and memgov_layer("memgov._claim") == "core"
    assert getattr(layer_of("memgov/cli/render.py"), "name", None) == "cli"
    assert getattr(layer_of("memgov/decide/model.py"), "name", None) == "decide"
    assert memgov_layer("memgov.decide.policies") == "decide"
    # A command module back among the library's files would be core, and fail its rules.
    assert getattr(layer_of("memgov/_cli_pack.py"), "name", None) == "core"


def test_only_the_exporter_imports_prometheus_client() -> None:
    # An optional extra (memgov-gpu[exporter]): nothing else may need it, and the cli reaches it
    # only inside the command, so `memgov --help` works without it.
    outside = [
        f"{path.relative_to(ROOT)}:{imp.line} imports {imp.module}"
        for path in files()
        if "exporter" not in path.relative_to(ROOT).parts[:2]
        for imp in imports(path)
        if imp.module.split(".")[0] == "prometheus_client"
    ]
    assert not outside, "\n".join(outside)
    cli = imports(ROOT / "memgov" / "cli" / "exporter.py")
    eager = [i for i in cli if i.module_level and i.module.startswith("memgov.exporter.")]
    assert not eager, eager


def test_the_command_line_lives_in_its_folder() -> None:
    # Whatever imports typer or rich at module level is under memgov/cli/ (docs/architecture.md).
    outside = [
        f"{path.relative_to(ROOT)}:{imp.line} imports {imp.module}"
        for path in files()
        if "cli" not in path.relative_to(ROOT).parts
        for imp in imports(path)
        if imp.module_level and imp.module.split(".")[0] in CLI_LIBRARIES
    ]
    assert not outside, "\n".join(outside)
    assert (ROOT / "memgov" / "cli" / "__init__.py").is_file()


def broken(relative: str, found: list[Import]) -> list[str]:
    """The imports of the file ``relative`` that its layer does not allow."""
    layer = layer_of(relative)
    assert layer is not None, relative
    wrong = []
    for imp in found:
        top = imp.module.split(".")[0]
        where = f"{relative}:{imp.line} imports {imp.module}"
        if top == "memgov":
            target = memgov_layer(imp.module)
            if layer.may_import is not None and target not in layer.may_import:
                wrong.append(f"{where} ({layer.name} may not import {target})")
            if layer.memgov_modules is not None and imp.module not in layer.memgov_modules:
                allowed = sorted(layer.memgov_modules)
                wrong.append(f"{where} ({layer.name} may import only {allowed} of memgov)")
        elif top.startswith("memgov_") and layer.name != "adapters":
            wrong.append(f"{where} (adapters are plugins: reach them through memgov._adapters)")
        elif imp.module_level and top in layer.not_at_module_level:
            wrong.append(f"{where} at module level ({layer.name}: import it inside the function)")
    return wrong


@pytest.mark.parametrize("path", files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_keep_to_the_layers(path: Path) -> None:
    relative = str(path.relative_to(ROOT))
    if layer_of(relative) is None:
        pytest.skip("no layer (test_every_file_has_a_layer fails for it)")
    assert not broken(relative, imports(path)), "\n".join(broken(relative, imports(path)))


def test_an_import_back_up_a_wing_fails() -> None:
    # The wings' order is checked like the packages': a wing that imports one above it (here
    # MPS, in _gpu, taking the ledger's records; the ground taking a GPU) or the facade fails.
    up = [
        ("memgov/_gpu/mps.py", "memgov._ledger.records"),
        ("memgov/_base/settings.py", "memgov._gpu.devices"),
        ("memgov/_ledger/records.py", "memgov._claim"),
        ("memgov/_cpu/share.py", "memgov._profiles.store"),
        ("memgov/_profiles/store.py", "memgov._cpu.threads"),
    ]
    for relative, module in up:
        assert broken(relative, [Import(module, 1, False)]), (relative, module)
    assert not broken("memgov/_ledger/records.py", [Import("memgov._files.flock", 1, True)])
    found = {i.module for i in imports(ROOT / "memgov" / "_ledger" / "records.py")}
    assert "memgov._ledger.deadnames" in found  # from memgov._ledger import deadnames as ...


ONE_CIRCLE = {frozenset({"memgov/adapter.py", "memgov/_adapters.py"})}
"""The core's one circle (docs/architecture.md): the adapter contract's helpers call the loader
(memgov.adapter.view), which loads adapters written against that contract."""


def test_the_core_has_one_circle() -> None:
    # Every import of the core's files, also those inside functions (an import made late still
    # ties two modules), but not those under TYPE_CHECKING, which never run.
    core = [p for p in files() if getattr(layer_of(str(p.relative_to(ROOT))), "name", "") in CORE]
    graph: dict[str, set[str]] = {}
    for path in core:
        targets = set()
        for imp in imports(path):
            if _is_module(imp.module):
                targets.add(imp.module.replace(".", "/") + ".py")
        graph[str(path.relative_to(ROOT))] = targets & {str(p.relative_to(ROOT)) for p in core}
    assert {frozenset(c) for c in _circles(graph)} <= ONE_CIRCLE, _circles(graph)


def _circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components of more than one file (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                top = stack.pop()
                component.add(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in graph:
        if node not in index:
            visit(node)
    return found


# Written in pieces so that this file does not match itself.
OUTSIDE = re.compile(
    "|".join(["/wo" + "rk/", "\\.\\./sha" + "red", "REFER" + "ENCE", r"(?i:\bissue\s+\d)"])
)
"""Citations a reader of the repository cannot follow: the authors' machine and reference notes,
and issue numbers of a tracker that is not part of the repository."""
TEXT_SUFFIXES = {".py", ".md", ".sh", ".toml", ".txt", ".cfg", ".ini", ".yml", ".yaml"}
NOT_OURS = {"results", "build", "dist", "pack-results", "out", "node_modules"}
"""results/ keeps raw output exactly as produced; the rest are build and run outputs."""


def own_text_files() -> list[Path]:
    found = []
    for path in ROOT.rglob("*"):
        parts = path.relative_to(ROOT).parts
        if any(p.startswith(".") or p in NOT_OURS or p.endswith(".egg-info") for p in parts):
            continue
        if path.is_file() and (path.suffix in TEXT_SUFFIXES or path.name == "Dockerfile"):
            found.append(path)
    return sorted(found)


def test_comments_and_docs_cite_only_the_repository() -> None:
    cited = []
    for path in own_text_files():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if OUTSIDE.search(line):
                cited.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not cited, "cite docs/ or results/ instead:\n" + "\n".join(cited)
