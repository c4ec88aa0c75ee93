"""DeepGEMM's block-FP8 GEMM through SGLang, --fp8-gemm-backend deep_gemm (SM90, SM100)."""
from autotune.families.fp8_gemm import SglangLinear

RUNNER = SglangLinear("fp8_gemm", "deep_gemm", "deep_gemm", "deep_gemm fp8 GEMM (block [128, 128])",
                      sms=frozenset({90, 100, 103}), needs=("deep_gemm",),
                      function="deepgemm_w8a8_block_fp8_linear_with_fallback")
