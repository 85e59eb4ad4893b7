"""Profiles across real users of one host (docs/profiles.md): another user can neither read a
user's store nor poison it; a planted profile is ignored, said, and ``auto`` sizes without it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from .conftest import User

pytestmark = pytest.mark.host_changes("creates users mgl_a and mgl_b (useradd), removed after")

CLAIM_AUTO = """
import memgov
c = memgov.claim("auto", job="victim")
out({"sized": c.sized, "bytes": c.bytes, "line": c.reports.get("auto"),
     "profile": c.reports.get("profile")})
c.release()
"""


def test_a_planted_profile_folder_is_ignored(users: dict[str, User], shared: Path) -> None:
    a, b = users["mgl_a"], users["mgl_b"]
    # b makes a's folder first (the profiles folder is sticky and shared, like /tmp) and puts a
    # profile there that would make a's job claim 65 MiB and fail.
    planted = b.run(f"""
import json, os
from memgov._profiles import store as _profiles
base = {str(shared / "v1" / "_profiles")!r}
os.mkdir(os.path.join(base, "{a.uid}"), 0o777)
os.chmod(os.path.join(base, "{a.uid}"), 0o777)
run = {{"peak": 1, "end": "exit", "time": 1.0, "claim": None, "simulated": True}}
with open(os.path.join(base, "{a.uid}", _profiles.file_name("victim")), "w") as f:
    json.dump({{"version": 1, "job": "victim", "runs": [run]}}, f)
out("planted")
""")
    assert planted == "planted"
    got = a.run(CLAIM_AUTO)
    assert got["sized"] == "first-run" and got["bytes"] >= 2**30, got
    assert f"belongs to uid {b.uid}, not you (uid {a.uid})" in got["profile"]


def test_a_symlink_in_place_of_a_users_folder_is_refused(
    users: dict[str, User], shared: Path
) -> None:
    a, b = users["mgl_a"], users["mgl_b"]
    b.run(f"""
import os
from memgov._profiles import store as _profiles
_profiles.record("bait", "bait", [{{"peak": 1, "end": "exit", "time": 1.0, "claim": None,
                                   "simulated": True}}])
base = {str(shared / "v1" / "_profiles")!r}
os.symlink(os.path.join(base, "{b.uid}"), os.path.join(base, "{a.uid}"))
out("linked")
""")
    got = a.run(CLAIM_AUTO)
    assert got["sized"] == "first-run" and "symlink" in got["profile"], got


def test_a_users_store_is_private(users: dict[str, User], shared: Path) -> None:
    a, b = users["mgl_a"], users["mgl_b"]
    first = a.run(CLAIM_AUTO)
    assert first["sized"] == "first-run" and first["profile"] is None
    second = a.run(CLAIM_AUTO)  # a's own profile now sizes a's job
    assert second["sized"] == "profile", second
    folder = shared / "v1" / "_profiles" / str(a.uid)
    assert folder.stat().st_uid == a.uid and folder.stat().st_mode & 0o777 == 0o700
    seen = b.run(f"""
import os
from memgov._profiles import store as _profiles
try:
    os.listdir({str(folder)!r})
    listed = "listed"
except PermissionError:
    listed = "refused"
found, problems = _profiles.every()
out({{"listed": listed, "jobs": [p.job for p in found], "problems": problems}})
""")
    assert seen == {"listed": "refused", "jobs": [], "problems": []}
    # b's job of the same name is b's own: a first run, a's peaks unseen.
    assert b.run(CLAIM_AUTO)["sized"] == "first-run"
    names = sorted(os.listdir(folder))
    # .lock, live/, the victim's profile and its first-run lock (<job>.first): nothing of b's
    assert "live" in names and len(names) == 4, names
    assert all(folder.joinpath(n).stat().st_uid == a.uid for n in names)
