"""Model loading: the embedded pair (a PyPI wheel's GGUF, converted once; the draft in ``assets/``),
hub pairs, devices, and the feature drafters (EAGLE, Medusa) with their training code."""
