"""Domain logic of hybrid retrieval: analyzers, retrievers, fusion, the search pipeline.

Pure Python and NumPy: nothing here imports FastAPI.
"""
