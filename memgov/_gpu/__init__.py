"""The GPUs: NVML, devices, the GPU schedulers' budgets, MPS and its pipe, enforcement."""
