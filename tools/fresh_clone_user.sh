#!/usr/bin/env bash
# A fresh clone as a throwaway plain user: the README's set-up and test commands, the host's
# state before and after, the user removed (results/cpu-2core/*-fresh-clone-user*.txt).
#   sudo tools/fresh_clone_user.sh USER OUTFILE [REPO]
# REPO (default: this checkout) gives its main branch, cloned from a bundle. Run it where
# users may be added.
set -u
user=$1; out=$2
repo=${3:-$(cd "$(dirname "$0")/.." && pwd)}
rev=$(git -C "$repo" rev-parse main)
state() { echo "users: $(getent passwd | wc -l) dpkg: $(dpkg -l | grep -c '^ii') dockerd: $(pgrep -c dockerd) /tmp entries: $(ls -A /tmp | wc -l) /dev/shm entries: $(ls -A /dev/shm | wc -l)"; }
{
echo "# fresh clone of main as $user, $(date -u +%FT%TZ), $(nproc) cores, $(uname -r)"
echo "# source: main of $repo at $rev, cloned from a bundle to /home/$user/memgov"
echo "# steps: tools/fresh_clone_user.sh (useradd; the user clones, runs the README's set-up and test commands; pkill -u, userdel -r)"
git -C "$repo" bundle create /tmp/fresh-$user.bundle main -q 2>/dev/null || git -C "$repo" bundle create /tmp/fresh-$user.bundle main
chmod 644 /tmp/fresh-$user.bundle
echo "## making the throwaway user: useradd --create-home --shell /bin/bash $user"
ls -A /tmp | sort > /tmp/fresh-$user.before
echo "## host before: $(state)"
useradd --create-home --shell /bin/bash "$user"; id "$user"
t0=$SECONDS
su - "$user" -c "git clone -q /tmp/fresh-$user.bundle memgov && cd memgov && git checkout -q main && python3 -m venv .venv && .venv/bin/pip install -q torch==2.13.0 -e '.[all,dev]'" > /tmp/fresh-$user.setup 2>&1
echo "## set-up (README), as $user: exit $? in $((SECONDS - t0)) s"; tail -3 /tmp/fresh-$user.setup | grep -v "^WARNING: Location" 
t0=$SECONDS
su - "$user" -c "cd memgov && .venv/bin/python -m pytest -q -p no:cacheprovider" > /tmp/fresh-$user.tests 2>&1
echo "## tests (README: .venv/bin/python -m pytest -q), as $user: exit $? in $((SECONDS - t0)) s"
grep -v "^\.\+ *\[" /tmp/fresh-$user.tests | tail -25
echo "## processes of $user left: $(pgrep -u $user | wc -l)"
pkill -u "$user"; sleep 1; userdel -r "$user" 2>/dev/null; echo "## user removed: $(id $user >/dev/null 2>&1 && echo no || echo yes)"
rm -f /tmp/fresh-$user.bundle /tmp/fresh-$user.setup /tmp/fresh-$user.tests
ls -A /tmp | sort > /tmp/fresh-$user.after
echo "## host after: $(state)"
echo "## /tmp entries added:"; comm -13 /tmp/fresh-$user.before /tmp/fresh-$user.after | grep -v "^fresh-$user" 
rm -f /tmp/fresh-$user.before /tmp/fresh-$user.after
} > "$out" 2>&1
