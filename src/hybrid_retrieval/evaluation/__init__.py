"""Offline evaluation and benchmarks over BEIR-layout datasets."""
