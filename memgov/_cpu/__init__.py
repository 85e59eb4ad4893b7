"""CPUs and threads: the usable CPUs, their load, the host's CPU shares, thread budgets."""
