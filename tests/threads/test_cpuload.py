"""What a thread share may start at and grow into: the host's runnable count and idle cores,
read from files shaped like /proc's."""

from __future__ import annotations

import os
from pathlib import Path

from memgov._cpu import load as _cpuload

ALL = frozenset(range(os.cpu_count() or 1))


def test_runnable_elsewhere_leaves_out_the_reader(tmp_path: Path) -> None:
    loadavg = tmp_path / "loadavg"
    loadavg.write_text("3.10 2.50 1.00 19/1234 5678\n")
    assert _cpuload.runnable_elsewhere(ALL, loadavg) == 18
    loadavg.write_text("0.00 0.00 0.00 1/99 5678\n")
    assert _cpuload.runnable_elsewhere(ALL, loadavg) == 0


def test_runnable_elsewhere_is_unknown_where_it_would_mislead(tmp_path: Path) -> None:
    loadavg = tmp_path / "loadavg"
    loadavg.write_text("3.10 2.50 1.00 19/1234 5678\n")
    if len(ALL) > 1:  # pinned to part of the host: the host-wide count is not about its cores
        assert _cpuload.runnable_elsewhere(frozenset({0}), loadavg) is None
    for bad in ("", "1 2 3", "1 2 3 x/9 1"):
        loadavg.write_text(bad)
        assert _cpuload.runnable_elsewhere(ALL, loadavg) is None
    assert _cpuload.runnable_elsewhere(ALL, tmp_path / "missing") is None


def stat_text(cpus: dict[int, tuple[int, int]]) -> str:
    """/proc/stat with per-CPU (busy, idle) ticks: user busy, idle idle, the rest 0."""
    lines = ["cpu  1 2 3 4 5 6 7 8 0 0"]
    lines += [f"cpu{c} {busy} 0 0 {idle} 0 0 0 0 0 0" for c, (busy, idle) in cpus.items()]
    return "\n".join([*lines, "intr 1 2 3", "ctxt 99"]) + "\n"


def test_idle_cores_between_two_looks_on_the_processes_cpus_only(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    meter = _cpuload.IdleMeter(frozenset({0, 1}), stat)
    stat.write_text(stat_text({0: (100, 100), 1: (100, 100), 2: (0, 0)}))
    assert meter.idle_cores() is None  # the interval starts
    # cpu0 all busy, cpu1 three quarters idle, cpu2 (not ours) all idle.
    stat.write_text(stat_text({0: (200, 100), 1: (125, 175), 2: (0, 100)}))
    assert meter.idle_cores() == 0.75
    meter.forget()
    assert meter.idle_cores() is None and meter.readable


def test_an_unreadable_stat_says_so(tmp_path: Path) -> None:
    meter = _cpuload.IdleMeter(frozenset({0}), tmp_path / "missing")
    assert meter.idle_cores() is None and not meter.readable
    garbage = tmp_path / "garbage"
    garbage.write_text("cpuX a b c\ncpu0 1 2\n")
    meter = _cpuload.IdleMeter(frozenset({0}), garbage)
    assert meter.idle_cores() is None and not meter.readable


def test_idle_cores_are_split_among_the_governed_processes_that_see_them(tmp_path: Path) -> None:
    """Every governed process on the cores sees the same idle cores: each grows into its part
    of them, not all of them (8 jobs each growing by 6 idle cores would oversubscribe them)."""
    from memgov._cpu.threads import _Growth

    stat = tmp_path / "stat"
    cpus = dict.fromkeys(range(8), (100, 100))
    for neighbours, grown in ((8, 1), (3, 3), (1, 7)):
        growth = _Growth(_cpuload.IdleMeter(frozenset(range(8)), stat))
        stat.write_text(stat_text(cpus))
        assert growth.target(1, 8, now=0.0, neighbours=neighbours) == 1  # the interval starts
        # Six of the eight cores idle over the interval.
        later = {c: (200, 100) if c < 2 else (100, 200) for c in range(8)}
        stat.write_text(stat_text(later))
        assert growth.target(1, 8, now=1.0, neighbours=neighbours) == grown
