"""Bad trace and node files get a clear error saying what is accepted (placement/trace.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from memgov import MemgovError
from memgov.placement import TraceError, load_nodes, load_trace

HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n"


def write(tmp_path: Path, text: str | bytes, name: str = "f.csv") -> Path:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def test_a_good_trace_and_node_list_load(tmp_path: Path) -> None:
    jobs = load_trace(write(tmp_path, HEADER + "p0,4000,1024,1,500,T4|A10\np1,2000,0,0,0,\n"))
    assert [(j.name, j.gpu_milli, j.gpu_spec) for j in jobs] == [
        ("p0", 500, ("T4", "A10")),
        ("p1", 0, ()),
    ]
    nodes = load_nodes(write(tmp_path, "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,T4\n"))
    assert nodes[0].gpus == 2 and nodes[0].gpu_memory() == 15109


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("name,cpu_milli\np0,1\n", "missing column(s) memory_mib, num_gpu, gpu_milli"),
        (HEADER + "p0,lots,1024,1,500,\n", "line 2: cpu_milli='lots'; accepted a whole number"),
        (
            HEADER + "p0,4000,1024,1,1500,\n",
            "gpu_milli='1500'; accepted a whole number from 0 to 1000",
        ),
        (HEADER + "p0,4000,1024,-1,500,\n", "num_gpu='-1'"),
        (HEADER + "p0,4000,1024,2,500,\n", "takes them whole (gpu_milli=1000)"),
        (HEADER + "p0,4000,1024,1,0,\n", "num_gpu=1 with gpu_milli=0"),
        (HEADER + "p0,4.5,1024,0,0,\n", "cpu_milli='4.5'"),
        (HEADER, "no rows"),
        ("", "missing column(s)"),
    ],
)
def test_a_bad_trace_says_what_is_accepted(tmp_path: Path, text: str, says: str) -> None:
    with pytest.raises(TraceError) as caught:
        load_trace(write(tmp_path, text))
    assert says in str(caught.value)
    assert isinstance(caught.value, MemgovError)


def test_binary_and_missing_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="not a CSV file"):
        load_trace(write(tmp_path, b"\xff\xfe\x00garbage\x00\x81"))
    with pytest.raises(TraceError, match="cannot be read"):
        load_trace(tmp_path / "absent.csv")


def test_a_node_list_without_gpus_or_with_garbage_is_refused(tmp_path: Path) -> None:
    header = "sn,cpu_milli,memory_mib,gpu,model\n"
    with pytest.raises(TraceError, match="no node has a GPU"):
        load_nodes(write(tmp_path, header + "n0,64000,1024,0,\n"))
    with pytest.raises(TraceError, match="gpu='two'"):
        load_nodes(write(tmp_path, header + "n0,64000,1024,two,T4\n"))
    with pytest.raises(TraceError, match="missing column"):
        load_nodes(write(tmp_path, "sn,cpu\nn0,1\n"))
