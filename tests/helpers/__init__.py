"""Helpers for memgov tests: child processes that claim, and a ledger monitor."""
