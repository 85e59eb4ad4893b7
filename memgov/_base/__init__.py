"""The core's ground: errors, sizes, the MEMGOV_* settings table, config, signals, import hooks."""
