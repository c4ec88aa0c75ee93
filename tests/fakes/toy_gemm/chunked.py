"""The product as 16 partial products over K; stands for --fp8-gemm-backend cutlass."""
from . import ToyRunner

RUNNER = ToyRunner("toy_gemm", "chunked", "cutlass", "torch matmul, 16 partial products", chunks=16)
