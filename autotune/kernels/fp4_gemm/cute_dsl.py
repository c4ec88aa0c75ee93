"""FlashInfer's mm_fp4 in CuTe DSL, --fp4-gemm-backend flashinfer_cutedsl (SGLang's auto on SM100)."""
from . import MmFp4

RUNNER = MmFp4("fp4_gemm", "cute-dsl", "flashinfer_cutedsl", "flashinfer.mm_fp4(backend='cute-dsl')",
               ("mm_fp4", "cute-dsl"), backend="cute-dsl")
