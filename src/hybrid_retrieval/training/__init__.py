"""Fitting parts on labelled queries: metrics, fusion tuning, hubness beta tuning, reranker training.

Imports search, models and indexer; never evaluation or the CLI. Test queries never reach it
(`refuse_test_split`).
"""
