"""Peak memory of fitting hubness corrections at scale, on random unit vectors.

Usage: python -m bench.hubness_memory [--bank 100000] [--docs 50000] [--dim 384]
Prints one JSON line: sizes, seconds and the process's peak resident memory.
"""

from __future__ import annotations

import argparse
import json
import resource
import time

import numpy as np

from hybrid_retrieval.indexer.hubness import fit_correction, sample_gallery
from hybrid_retrieval.search.hubness import HubnessParams


def unit_vectors(n: int, dim: int, rng) -> np.ndarray:
    x = rng.standard_normal((n, dim), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bank", type=int, default=100_000)
    parser.add_argument("--docs", type=int, default=50_000)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--gallery", type=int, default=10_000)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    docs, bank = unit_vectors(args.docs, args.dim, rng), unit_vectors(args.bank, args.dim, rng)
    start = time.perf_counter()
    gallery = sample_gallery(len(docs), args.gallery)
    fit_correction(bank, docs[gallery], gallery, docs, HubnessParams())
    print(
        json.dumps(
            {
                "bank": args.bank,
                "docs": args.docs,
                "dim": args.dim,
                "gallery": args.gallery,
                "inputs_mib": round((docs.nbytes + bank.nbytes) / 2**20, 1),
                "fit_seconds": round(time.perf_counter() - start, 1),
                "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
