"""How good a ranking is, and whether a difference is real: retrieval metrics (pytrec_eval), the paired randomisation
test, and the labelled splits that tuning may and may not use. Evaluation and training both measure with it."""
