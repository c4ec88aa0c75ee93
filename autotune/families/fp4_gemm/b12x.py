"""FlashInfer's b12x NVFP4 GEMM: what mm_fp4's own auto prefers on SM120; SGLang reaches it only
through `auto`, so it has no server-argument value. Needs CUDA 13."""
from autotune.families.fp4_gemm import MmFp4

RUNNER = MmFp4("fp4_gemm", "b12x", None, "flashinfer.mm_fp4(backend='b12x')", ("mm_fp4", "b12x"),
               min_cuda=(13, 0), tunable=True, backend="b12x",
               flashinfer_op="fp4_gemm", flashinfer_runner="B12xFp4GemmRunner")
