#!/bin/bash
# The figures of a consolidation pass (results/HISTORY.md), for the checkout in the current folder: each
# command, then its raw output. Run it in a checkout of the tree to measure (an older one too:
# function_lengths.py is taken from beside this script):
#     bash /path/to/tools/consolidation_figures.sh "LABEL" > OUT.txt
# Needs ruff and mypy (the dev extra's pins; PATH or .venv/bin) and `duplicates` on PATH.
HERE=$(cd "$(dirname "$0")" && pwd)
[ -x .venv/bin/ruff ] && PATH="$PWD/.venv/bin:$PATH"
export PATH
echo "################ ${1:-this checkout}: $(git log --oneline -1 | cut -c1-90)"
echo "# in $PWD; $(ruff --version), mypy $(mypy --version | cut -d' ' -f2)"
show() {
    echo
    echo "\$ $1"
    bash -c "$1" 2>&1
}
show "git ls-files memgov | grep '\\.py\$' | xargs cat | grep -cv '^[[:space:]]*\$'  # non-blank"
show "python $HERE/function_lengths.py --over 50 memgov"
show "ruff check --select C901 --config 'lint.mccabe.max-complexity=10' --output-format concise memgov"
show "duplicates --most 200 --seconds 120"
show "ruff format --check . | tail -3"
show "mypy | tail -3"
