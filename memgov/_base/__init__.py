"""The core's ground floor: errors, sizes, the MEMGOV_* settings table, config, signals, import
hooks. Imports nothing of memgov but itself (docs/architecture.md, "The core's wings")."""
