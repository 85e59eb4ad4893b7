"""The settings table (memgov/_base/settings.py): every MEMGOV_* variable is a row, each row parses
its own variable and names it in errors, and the docs, the .pth line and pack read the table."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import memgov
from memgov import _autoenable
from memgov._base import settings as _settings
from memgov._base.sizes import Size
from tests.helpers.generated import check_shown

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "auto-enable.md"
BEGIN = "<!-- settings table: begin (generated, do not edit: python -m memgov._base.settings) -->\n"
END = "<!-- settings table: end -->"

GARBAGE = {
    "MEMGOV_CLAIM": "lots",
    "MEMGOV_DEVICE": None,  # any text is a device selector; matched against the GPUs at claim
    "MEMGOV_WAIT": "soon",
    "MEMGOV_STRICT": "maybe",
    "MEMGOV_QUIET": "maybe",
    "MEMGOV_GC_FREEZE": "sometimes",
    "MEMGOV_VIEWS": "sometimes",
    "MEMGOV_THREADS": "many",
    "MEMGOV_MPS": "on",
    "MEMGOV_DIR": "relative/ledger",
    "MEMGOV_DEVICES": "sim0",
    "MEMGOV_RESERVE": "plenty",
    "MEMGOV_CONTEXTS": "0",
    "MEMGOV_MPS_CLIENTS": "-3",
    "MEMGOV_MPS_POLICY": "random",
    "MEMGOV_SHARD_SIZE": "big",
    "MEMGOV_TORCH_MARGIN": "10%",
    "MEMGOV_JOB": "j" * 129,
    "MEMGOV_GIVE_BACK": "soon",
}
"""A value each user setting refuses (None: it accepts any text)."""


def test_the_docs_show_the_table() -> None:
    check_shown(DOC, BEGIN, END, _settings.markdown, "memgov._base.settings")


def test_every_memgov_variable_in_the_code_is_a_row() -> None:
    """A variable read anywhere in memgov or its adapters has a row (and so docs and doctor)."""
    found: set[str] = set()
    for path in [*ROOT.joinpath("memgov").rglob("*.py"), *ROOT.joinpath("adapters").rglob("*.py")]:
        found |= set(re.findall(r"\bMEMGOV_[A-Z][A-Z_]*[A-Z]\b", path.read_text()))
    assert found - set(_settings.names()) == set()


def test_garbage_covers_every_user_setting() -> None:
    assert set(GARBAGE) == set(_settings.names(internal=False))


@pytest.mark.parametrize("name", [n for n, v in GARBAGE.items() if v is not None])
def test_each_parser_names_its_variable_and_what_it_accepts(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(name, GARBAGE[name] or "")
    with pytest.raises(memgov.ConfigError) as info:
        _settings.get(name)
    message = str(info.value)
    assert message.startswith((f"{name}={GARBAGE[name]!r}", f"{name}: ", f"{name} item ")), message
    assert "accepted" in message or "must be" in message, message
    assert any(name in p for p in _settings.problems())


def test_unset_and_blank_are_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    for row in _settings.TABLE:
        monkeypatch.setenv(row.name, "  ")
        assert _settings.get(row.name) == row.unset
        monkeypatch.delenv(row.name)
        assert _settings.get(row.name) == row.unset


def test_values_parse_once_into_what_callers_use(monkeypatch: pytest.MonkeyPatch) -> None:
    get = _settings.get
    monkeypatch.setenv("MEMGOV_CLAIM", " GROWTH ")
    assert get("MEMGOV_CLAIM") == "growth"
    monkeypatch.setenv("MEMGOV_CLAIM", "25%")
    size = get("MEMGOV_CLAIM")
    assert isinstance(size, Size) and size.on(16 * 2**30) == 4 * 2**30
    monkeypatch.setenv("MEMGOV_WAIT", "0")
    assert get("MEMGOV_WAIT") is None  # 0 fails at once, like unset
    monkeypatch.setenv("MEMGOV_WAIT", "2.5")
    assert get("MEMGOV_WAIT") == 2.5
    monkeypatch.setenv("MEMGOV_THREADS", "3")
    assert get("MEMGOV_THREADS") == _settings.Threads("fixed", 3)
    monkeypatch.setenv("MEMGOV_CONTEXTS", "OFF")
    assert get("MEMGOV_CONTEXTS") == 0
    monkeypatch.setenv("MEMGOV_TORCH_MARGIN", "1MiB")
    assert get("MEMGOV_TORCH_MARGIN") == 2**20


def test_a_size_from_a_setting_keeps_its_name_past_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    """MEMGOV_CLAIM=999TiB reads as a size; the device it does not fit on is found at claim, and
    that error names MEMGOV_CLAIM too (it used to speak of a "claim size")."""
    monkeypatch.setenv("MEMGOV_DEVICES", "sim0:16GiB")
    monkeypatch.setenv("MEMGOV_CLAIM", "999TiB")
    with pytest.raises(
        memgov.ConfigError,
        match=r"^MEMGOV_CLAIM: '999TiB' .* larger than the "
        r"device .*; accepted at most",
    ):
        memgov.claim(_settings.get("MEMGOV_CLAIM"))
    assert memgov.current() is None


def test_options_and_arguments_are_named_their_own_way() -> None:
    with pytest.raises(memgov.ConfigError, match=r"^--claim 'lots': accepted a size"):
        _settings.claim_setting("lots", "--claim")
    with pytest.raises(memgov.ConfigError, match=r"^wait=-1: accepted seconds >= 0"):
        _settings.wait_seconds(-1, "wait")
    with pytest.raises(memgov.ConfigError, match=r"^--wait nan: accepted seconds >= 0"):
        _settings.wait_seconds(float("nan"), "--wait")


def test_triggers_and_the_pth_line_come_from_the_table() -> None:
    assert _settings.TRIGGERS[0] == "MEMGOV_CLAIM"
    line = _settings.pth_line()
    assert set(re.findall(r"'([A-Z_]+)'", line)) == set(_settings.TRIGGERS)
    assert _autoenable.triggered({"MEMGOV_CLAIM": "1GiB"})
    assert _autoenable.triggered({"CUDA_DEVICE_MEMORY_LIMIT_0": "1g"})
    assert not _autoenable.triggered({"MEMGOV_WAIT": "5"})  # only the claim wakes it


def test_doctor_lists_every_row(monkeypatch: pytest.MonkeyPatch) -> None:
    from memgov import _doctor
    from memgov.cli.doctor import render

    monkeypatch.setenv("MEMGOV_DEVICES", "sim0:16GiB")
    monkeypatch.setenv("MEMGOV_MPS_POLICY", "random")
    report = _doctor.diagnose()
    rows = {row["name"]: row for row in report["settings"]}
    assert list(rows) == list(_settings.names())
    assert rows["MEMGOV_DEVICES"]["source"] == "environment"
    assert rows["MEMGOV_WAIT"]["source"] == "default"
    assert rows["MEMGOV_MPS_POLICY"]["problem"].startswith("MEMGOV_MPS_POLICY='random': accepted")
    lines = render(report)
    assert "setting problem: MEMGOV_MPS_POLICY='random': accepted fill" in "\n".join(lines)
    assert any(
        line.startswith("settings at their defaults: ") and "MEMGOV_WAIT" in line for line in lines
    )


def test_the_shared_ledger_is_the_default_where_root_made_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """docs/ledger.md, "Many users on a host": with MEMGOV_DIR unset, the shared folder is the
    ledger once root has made it (no process falls back to a second ledger of its own); a
    folder anyone else made or may write, or a link, is not taken."""
    import os

    from memgov._base import config as _config

    shared = tmp_path / "memgov-ledger"
    monkeypatch.setattr(_config, "SHARED_DIR", str(shared))
    monkeypatch.delenv("MEMGOV_DIR", raising=False)
    default = Path(_settings.DEFAULT_DIR)
    assert _config.ledger_dir() == default  # not made
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    assert _config.ledger_dir() == (shared if os.geteuid() == 0 else default)
    shared.chmod(0o777)  # writable by others: anyone could have put things in it
    assert _config.ledger_dir() == default
    shared.rmdir()
    (tmp_path / "elsewhere").mkdir(mode=0o755)
    shared.symlink_to(tmp_path / "elsewhere")
    assert _config.ledger_dir() == default
    monkeypatch.setenv("MEMGOV_DIR", str(tmp_path / "mine"))
    assert _config.ledger_dir() == tmp_path / "mine"


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("150%", "('150%' must be a percentage in (0, 100])"),
        ("0", "('0' must be more than 0 bytes)"),
        ("lots", "(cannot read 'lots' as a size)"),
    ],
)
def test_a_refused_claim_says_why_beside_what_is_accepted(value: str, reason: str) -> None:
    with pytest.raises(memgov.ConfigError) as info:
        _settings.claim_setting(value, "--claim")
    message = str(info.value)
    assert message.startswith(f"--claim {value!r}: accepted a size") and message.endswith(reason)
