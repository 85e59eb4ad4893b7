#!/usr/bin/env bash
# The public cluster-trace-gpu-v2023 pod lists (default and its 23 variants, about 0.6 MB each)
# into an ignored folder, at the commit benchmarks/placement/data/SOURCE.md names: the 22x10
# table (benchmarks/placement/placement_table.py --variants) reads them from there. Not vendored:
# they would grow the tracked tree by about 14 MB.
#
#   bash benchmarks/placement/fetch_variants.sh [DIR]    # DIR: .public/traces by default
set -euo pipefail

REPO=${CLUSTERDATA_REPO:-https://github.com/alibaba/clusterdata.git}  # or a local mirror
COMMIT=7a6c496e4f4b6ce6150be8f881cb051bf2abff42
FOLDER=cluster-trace-gpu-v2023/csv
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DIR=${1:-$ROOT/.public/traces}
CLONE=$ROOT/.public/clusterdata

mkdir -p "$DIR"
if [ ! -d "$CLONE/.git" ]; then
    # Blobs on demand and one folder checked out: the repository's other traces are gigabytes.
    git clone --quiet --filter=blob:none --no-checkout "$REPO" "$CLONE"
fi
git -C "$CLONE" fetch --quiet origin "$COMMIT" 2>/dev/null || true
git -C "$CLONE" checkout --quiet "$COMMIT" -- "$FOLDER"
cp "$CLONE/$FOLDER"/openb_pod_list_*.csv "$CLONE/$FOLDER"/openb_node_list_gpu_node.csv "$DIR"/
echo "$(ls "$DIR"/openb_pod_list_*.csv | wc -l) pod lists in $DIR (commit $COMMIT)"
