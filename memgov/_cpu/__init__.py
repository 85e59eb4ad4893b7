"""CPUs and threads: the usable CPUs, their load, the host's CPU shares, thread budgets. Imports
_base, _files and _ledger (the shares are ledger records)."""
