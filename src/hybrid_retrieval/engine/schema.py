"""The storage vocabulary the service's schemas and settings validate against, named at the engine's door so the
HTTP layer needs nothing of the storage modules behind it."""

from hybrid_retrieval.indexer.chunking import CHUNKING_METHODS
from hybrid_retrieval.indexer.store import VERIFY_MODES

__all__ = ["CHUNKING_METHODS", "VERIFY_MODES"]
