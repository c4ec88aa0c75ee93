"""sgl_kernel's CUTLASS blockwise FP8 GEMM through SGLang, --fp8-gemm-backend cutlass."""
from autotune.families.fp8_gemm import SglangLinear

RUNNER = SglangLinear("fp8_gemm", "cutlass", "cutlass", "sgl_kernel fp8_blockwise_scaled_mm",
                      sms=frozenset({90, 100, 103, 120, 121}), needs=("sgl_kernel",),
                      function="cutlass_w8a8_block_fp8_linear_with_fallback")
