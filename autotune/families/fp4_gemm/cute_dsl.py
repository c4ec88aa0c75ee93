"""FlashInfer's mm_fp4 in CuTe DSL through SGLang's NVFP4 linear, --fp4-gemm-backend flashinfer_cutedsl
(SGLang's auto on SM100)."""
from autotune.families.fp4_gemm import SglangFp4Linear

RUNNER = SglangFp4Linear("fp4_gemm", "cute-dsl", "flashinfer_cutedsl", "flashinfer.mm_fp4(backend='cute-dsl')",
                         ("mm_fp4", "cute-dsl"), backend="cute-dsl")
