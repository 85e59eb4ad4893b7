"""A stand-in pynvml with nvidia-ml-py's memory calls (put this folder on PYTHONPATH)."""
