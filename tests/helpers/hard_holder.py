"""A child process that holds a hard-mode claim written by admission itself (no MPS needed): it
plays an MPS client whose slot the ledger counts, until it is killed or a line reaches its stdin."""

from __future__ import annotations

import subprocess
import sys

HOLDER = """
import sys
from memgov._ledger import admission as _admission
from memgov._gpu.devices import candidates
from memgov._ledger.ledger import DeviceLedger
(device,) = candidates(None)
held = _admission.admit([DeviceLedger(device)], _admission.Request(
    {device.uuid: 2**30}, "holder", modes={device.uuid: ("hard", "test")}, daemons=DAEMONS
))  # kept: the record's lock lives with its object
print("admitted", flush=True)
sys.stdin.readline()
"""


def start(daemons: tuple[int, ...] = ()) -> subprocess.Popen[str]:
    """Start a holder of 1 GiB on the one device (on one of memgov's MPS ``daemons``, if any)
    and wait until it is admitted; the caller kills it (and waits)."""
    script = HOLDER.replace("DAEMONS", repr(tuple(daemons)))
    child = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    line = child.stdout.readline().strip()
    if line != "admitted":
        child.kill()
        child.wait()
        raise AssertionError(f"the holder was not admitted: {line!r}")
    return child
