"""Every pack option is defined once (a field of memgov/pack/config.py's PackConfig) and every
front end derives from it: `memgov pack`, `memgov ray pack`, the library and docs/pack.md's table.
The last test adds one option there, in a copy of the package, and finds it in all four."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from memgov.pack import config
from tests.helpers.generated import check_shown

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "pack.md"
BEGIN = "<!-- options table: begin (generated, do not edit: python -m memgov.pack.config) -->\n"
END = "<!-- options table: end -->"


def test_the_docs_show_the_table() -> None:
    # python -m memgov.pack.config prints it, with no runpy warning (memgov.pack's exports are
    # lazy: the package does not import the module first).
    check_shown(DOC, BEGIN, END, config.markdown, "memgov.pack.config")


def test_every_option_has_a_help_line_and_a_docs_row() -> None:
    for option in config.options():
        assert option.spec.help.strip(), option.name
        assert option.flag in config.markdown(), option.name


def test_ray_pack_takes_its_options_from_the_same_table() -> None:
    ray = {o.name: o.default for o in config.options("ray")}
    assert ray["claim"] == "1GiB" and ray["threads"] == 1  # its own defaults, pack's checks
    many = config.PackConfig("mnist", n=config.MAX_JOBS + 1)
    config.check_options(many, "ray")  # a cluster runs more jobs than one GPU takes
    with pytest.raises(config.ConfigError, match="--n 1025: accepted a whole number from 1 to"):
        config.check_options(many)
    assert {"n", "framework", "epochs", "batch", "device", "wait", "timeout"} <= set(ray)


SHINY = """    shiny: int = option(
        3, "Shiny things per job.", value="K", doc="shiny things per job (a test's option)",
        check=_count(9), env="MEMGOV_SHINY", ray=True)
"""
"""One new option, written where every option is defined."""

PROBE = """
import json, sys, typer.testing
from memgov.cli import app
from memgov.pack.config import PackConfig, check_options, markdown
from memgov.cli._packoptions import config
from memgov.ray._pack import job_spec

runner = typer.testing.CliRunner()
pack_help = runner.invoke(app, ["pack", "--help"], terminal_width=200).output
ray_help = runner.invoke(app, ["ray", "pack", "--help"], terminal_width=200).output
refused = runner.invoke(app, ["pack", "--device", "cpu", "--shiny", "12", "mnist"])
from memgov.pack.config import options
given = {o.name: o.text_default if o.spec.text else o.default for o in options("ray")}
cfg = config("ray", {**given, "shiny": 5}, experiment="mnist")
check_options(cfg, "ray")
print(json.dumps({
    "pack_help": pack_help, "ray_help": ray_help,
    "refused": [refused.exit_code, refused.output],
    "library": PackConfig("mnist").shiny, "ray_spec": job_spec(cfg, None),
    "table": markdown(),
}))
"""


def test_one_new_option_in_one_place_reaches_every_front_end(tmp_path: Path) -> None:
    shutil.copytree(
        ROOT / "memgov", tmp_path / "memgov", ignore=shutil.ignore_patterns("__pycache__")
    )
    source = tmp_path / "memgov" / "pack" / "config.py"
    text = source.read_text(encoding="utf-8")
    anchor = "    trainer_args: list[str] = field(default_factory=list)\n"
    assert text.count(anchor) == 1
    source.write_text(text.replace(anchor, SHINY + anchor), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "COLUMNS": "200"}
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        env=env,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert "--shiny" in seen["pack_help"] and "Shiny things per job." in seen["pack_help"]
    assert "--shiny" in seen["ray_help"] and "[default: 3]" in seen["ray_help"]
    # Its check runs before anything starts, with the option's name and what it accepts.
    assert seen["refused"][0] == 2
    assert "--shiny 12: accepted a whole number from 1 to 9" in seen["refused"][1]
    assert seen["library"] == 3
    assert seen["ray_spec"]["shiny"] == 5  # what each Ray task is given
    assert "| `--shiny K` | 3 | shiny things per job (a test's option) |" in seen["table"]
    # The docs check now asks for the new row (the docs were not edited in the copy).
    with pytest.raises(AssertionError, match="table differs from the code"):
        check_shown(DOC, BEGIN, END, lambda: seen["table"], "memgov.pack.config")
