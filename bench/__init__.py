"""Benchmarks of hybrid-retrieval (not shipped with the package): `python -m bench --help`."""
