"""What jobs used: the profile store, job ids, sizing ``auto`` claims. Imports _base, _files,
_gpu and _ledger."""
