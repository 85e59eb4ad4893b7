#!/usr/bin/env bash
# Build the memgov-mnist image from this checkout.
#
#   examples/docker/build.sh [--tag memgov-mnist] [--base IMAGE] [--wheelhouse DIR] [--torch 2.13.0]
#
# The build context is only the files the Dockerfile copies, sent as a tar on stdin, so a
# virtual environment or results folder in the checkout never travels to the engine.
# --wheelhouse DIR: install every Python package from DIR (made with `pip download`, README.md)
# instead of PyPI: DIR is served on 127.0.0.1 for the build alone, which then runs with
# --network host (no bridge network, no registry, no internet needed).
set -euo pipefail

tag=memgov-mnist
base=""
wheelhouse=""
torch=""
while [ $# -gt 0 ]; do
  case "$1" in
    --tag) tag=$2; shift 2 ;;
    --base) base=$2; shift 2 ;;
    --wheelhouse) wheelhouse=$2; shift 2 ;;
    --torch) torch=$2; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "build.sh: unknown argument $1; accepted --tag, --base, --wheelhouse, --torch" >&2
       exit 2 ;;
  esac
done

root=$(cd "$(dirname "$0")/../.." && pwd)
args=(-f examples/docker/Dockerfile -t "$tag")
[ -n "$base" ] && args+=(--build-arg "BASE_IMAGE=$base")
[ -n "$torch" ] && args+=(--build-arg "TORCH_VERSION=$torch")

server=""
cleanup() { if [ -n "$server" ]; then kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; fi; }
trap cleanup EXIT
if [ -n "$wheelhouse" ]; then
  if [ ! -d "$wheelhouse" ] || ! ls "$wheelhouse"/*.whl >/dev/null 2>&1; then
    echo "build.sh: --wheelhouse $wheelhouse holds no .whl files (make it with pip download, README.md)" >&2
    exit 2
  fi
  # A free port, then a plain HTTP listing of the wheels that pip's --find-links reads.
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  python3 -m http.server --bind 127.0.0.1 --directory "$wheelhouse" "$port" >/dev/null 2>&1 &
  server=$!
  for _ in $(seq 50); do
    python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/')" 2>/dev/null && break
    sleep 0.1
  done
  args+=(--network host --build-arg "PIP_ARGS=--no-index --find-links http://127.0.0.1:$port/")
fi

cd "$root"
tar -c --exclude=__pycache__ --exclude="*.pyc" \
  pyproject.toml setup.py README.md LICENSE memgov adapters experiments/mnist examples/docker/Dockerfile \
  | docker build "${args[@]}" -
