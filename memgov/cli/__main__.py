"""`python -m memgov.cli`, the same as `memgov` and `python -m memgov`."""

from memgov.cli import main

main()
