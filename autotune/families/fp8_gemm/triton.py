"""SGLang's Triton block-FP8 GEMM (w8a8_block_fp8_matmul), --fp8-gemm-backend triton."""
from autotune.contract.capabilities import HOPPER_AND_UP
from autotune.families.fp8_gemm import SglangLinear

RUNNER = SglangLinear("fp8_gemm", "triton", "triton", "SGLang w8a8_block_fp8_matmul (Triton, block [128, 128])",
                      sms=frozenset({89}) | HOPPER_AND_UP, needs=("sglang",), function="triton_w8a8_block_fp8_linear")
