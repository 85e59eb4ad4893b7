"""First contact with `memgov pack`: a small CPU default with a fair solo reference and its
caveat, live progress with an ETA, plain output without a terminal (nothing wrapped or cut), and
clean errors for a bad --out or --python with no report for a run that never started."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from memgov.pack import PackConfig, plan, results
from memgov.pack.config import cores

from ._util import MNIST, ROOT, TINY, mnist_args, pack_cmd, report, run_pack


def test_cpu_default_is_small_and_its_solo_job_is_a_fair_reference(tmp_path: Path) -> None:
    ctx = plan.prepare(PackConfig(MNIST, n=2, device="cpu", out=tmp_path / "out"))
    assert ctx.epochs == 2  # experiment.toml [cpu], not the 5 epochs of [defaults]
    assert ctx.argv(ctx.plans[-1], 0)[-4:] == ["--limit", "1000", "--eval-limit", "500"]
    solo, main = ctx.plans
    assert (solo.role, main.role) == ("solo", "main")
    assert solo.threads == max(1, cores() // 2)  # what each of the 2 packed jobs gets
    head = results._head(ctx)
    assert head["cpu_defaults"] == {"epochs": 2, "args": ["--limit", "1000", "--eval-limit", "500"]}
    assert any("scale it with --epochs N" in n for n in head["notes"])
    assert any("not how they would pack on a GPU" in n for n in head["notes"])


def test_cpu_default_gives_way_to_what_the_user_asks(tmp_path: Path) -> None:
    ctx = plan.prepare(
        PackConfig(
            MNIST, n=2, device="cpu", epochs=1, out=tmp_path / "out", trainer_args=["--limit", "64"]
        )
    )
    assert ctx.epochs == 1 and ctx.argv(ctx.plans[-1], 0)[-2:] == ["--limit", "64"]
    assert ctx.cpu_defaults is None
    assert not any("small CPU run" in n for n in ctx.notes())


def test_progress_moves_within_epochs_with_an_eta_as_plain_lines() -> None:
    from memgov.cli import progress as _progress

    shown = io.StringIO()
    watcher = _progress.PackProgress()
    assert watcher.bar is None  # no terminal under pytest: plain lines
    watcher.console.file = shown
    run = SimpleNamespace(label="n2", mode="claim", mps=False, n=2)
    watcher.run_started(run)
    watcher.runs["n2"].started -= 30  # 30 s into the run
    for job in ("job-00", "job-01"):
        watcher.job_event(run, job, {"event": "start", "epochs": 2})
    assert len(shown.getvalue().splitlines()) == 1  # at most one plain line every 10 s
    watcher.runs["n2"].said -= _progress.PLAIN_EVERY_S
    watcher.job_event(run, "job-00", {"event": "progress", "epoch": 1, "samples": 500, "of": 1000})
    line = shown.getvalue().splitlines()[-1]
    assert "0/2 jobs done, 0.5/4 epochs (12%), ETA 0:03:" in line  # 30 s for 1/8: 210 s more
    watcher.run_ended(run, {})
    assert len(shown.getvalue().splitlines()) == 3  # the end of a run is always said


def test_plain_output_keeps_paths_and_reasons_whole(tmp_path: Path) -> None:
    out = tmp_path / ("a-long-folder-name-that-would-wrap-at-eighty-columns-" * 2) / "report"
    missing = tmp_path / ("no-such-data-file-with-a-name-long-enough-to-be-cut-" * 2) / "x.npz"
    done = run_pack(
        "--n",
        "1",
        "--device",
        "cpu",
        "--no-solo",
        "--epochs",
        "1",
        "--out",
        str(out),
        str(MNIST),
        "--",
        "--data",
        str(missing),
    )
    assert done.returncode == 1, done.stderr
    assert f"report: {out / 'report.json'}" in done.stdout.splitlines()[-1]
    failed = [line for line in done.stdout.splitlines() if line.startswith("failed ")]
    assert len(failed) == 1 and str(missing) in failed[0], done.stdout
    assert "\x1b[" not in done.stdout  # no colour codes in a log
    assert any(str(missing) in line for line in done.stderr.splitlines())


@pytest.mark.parametrize(
    ("args", "text"),
    [
        (["--python", "/no/such/python"], "--python '/no/such/python': no such file; accepted"),
        (["--python", "no-such-python-here"], "not found on PATH; accepted the path"),
        (["--python", "NOT-EXECUTABLE"], "not an executable file"),
    ],
)
def test_bad_python_is_refused_before_anything_is_written(tmp_path: Path, args, text) -> None:
    out = tmp_path / "out"
    if "NOT-EXECUTABLE" in args:
        plain = tmp_path / "plain-file"
        plain.write_text("not a program")
        args = ["--python", str(plain)]
    done = run_pack("--n", "1", "--device", "cpu", "--out", str(out), *args, str(MNIST), *TINY)
    assert done.returncode == 2
    assert text in done.stderr and "[Errno" not in done.stderr
    assert not out.exists()  # no report for a run that never started


def test_an_interpreter_without_the_framework_is_refused_before_any_job(tmp_path: Path) -> None:
    bare = tmp_path / "bare"  # a venv with no torch in it (and nothing else)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    out = tmp_path / "out"
    done = run_pack(
        "--n",
        "1",
        "--device",
        "cpu",
        "--out",
        str(out),
        "--python",
        str(bare / "bin" / "python"),
        str(MNIST),
        *TINY,
    )
    assert done.returncode == 2, done.stderr
    assert "--framework torch:" in done.stderr and "cannot import torch" in done.stderr
    assert not out.exists()  # no job started, no report


def test_bad_out_is_a_clean_error(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    for out, text in (
        (blocker, "a file of that name is in the way"),
        (blocker / "below", "cannot create the report folder (Not a directory)"),
    ):
        done = run_pack("--n", "1", "--device", "cpu", "--out", str(out), str(MNIST), *TINY)
        assert done.returncode == 2
        assert f"--out {out}: {text}" in done.stderr and "[Errno" not in done.stderr


def test_bundled_experiment_by_name(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = subprocess.run(
        pack_cmd(*mnist_args(out, "--no-solo", n=1, experiment="mnist")),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert report(out)["manifest"] == str(ROOT / "experiments" / "mnist" / "experiment.toml")
