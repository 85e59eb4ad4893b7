# Sourced by exporter_scrape.sh and exporter_memory.sh (from the checkout's root, with OUT set):
# memgov installed from this checkout, and prometheus_client importable, from a carried .whl/
# where the machine has no network (exporter_scrape.sh's head says how to fill it).
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 \
  || { echo "memgov install failed"; tail -20 "$OUT/install.log"; exit 1; }
python3 -c "import prometheus_client" 2>/dev/null \
  || python3 -m pip install -q --no-index --find-links .whl prometheus_client >>"$OUT/install.log" 2>&1 \
  || { echo "prometheus_client missing: carry .whl/ (see exporter_scrape.sh's head)"; exit 1; }
