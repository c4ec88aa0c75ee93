"""Twice the product: wrong everywhere, so the correctness gate must disqualify it."""
from . import ToyRunner

RUNNER = ToyRunner("toy_gemm", "doubled", "deep_gemm", "torch matmul, doubled", wrong=True)
