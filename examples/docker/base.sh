#!/usr/bin/env bash
# Make a Debian base image with Python 3.11 without any image registry (root, Debian/Ubuntu host).
#
#   examples/docker/base.sh [NAME] [CACHE.tar]
#
# debootstrap fetches bookworm's packages from the Debian mirror apt already uses; the root
# folder is imported as image NAME (default memgov-base:bookworm). With CACHE.tar the folder's
# tarball is kept there and reused next time (no debootstrap then). Needs: debootstrap, a
# running docker engine.
set -euo pipefail

name=${1:-memgov-base:bookworm}
cache=${2:-}

if docker image inspect "$name" >/dev/null 2>&1; then
  echo "base.sh: image $name exists"
  exit 0
fi
if [ -n "$cache" ] && [ -s "$cache" ]; then
  docker import - "$name" < "$cache"
  exit 0
fi
command -v debootstrap >/dev/null || {
  echo "base.sh: no debootstrap on PATH (apt-get install -y debootstrap)" >&2; exit 2; }

rootfs=$(mktemp -d /var/tmp/memgov-rootfs.XXXXXX)
trap 'rm -rf "$rootfs"' EXIT
debootstrap --variant=minbase --include=python3,python3-venv bookworm "$rootfs" >&2
# No package lists or caches in the image.
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
if [ -n "$cache" ]; then
  tar -C "$rootfs" -c . > "$cache.part" && mv "$cache.part" "$cache"
  docker import - "$name" < "$cache"
else
  tar -C "$rootfs" -c . | docker import - "$name"
fi
