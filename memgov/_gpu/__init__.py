"""The GPUs: NVML, the devices, the GPU schedulers' budgets, MPS and its control pipe, enforcement.
Imports _base and _files."""
