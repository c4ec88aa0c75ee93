"""x @ w.T in one product; SGLang's --fp8-gemm-backend triton stands for it here."""
from . import ToyRunner

RUNNER = ToyRunner("toy_gemm", "plain", "triton", "torch matmul")
