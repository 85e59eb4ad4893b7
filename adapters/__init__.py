"""Framework adapters, one folder each; installed as the packages memgov_<framework>.

This file only lets linters and type checkers see the folders as one tree.
"""
