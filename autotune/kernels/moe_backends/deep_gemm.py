"""DeepGEMM's grouped FP8 GEMMs through SGLang's MoE block, --moe-runner-backend deep_gemm (block-FP8
experts); needs the deep_gemm package."""
from ...gpus import SM100S
from . import SglangMoe

RUNNER = SglangMoe("moe_fp8", "deep_gemm", "deep_gemm", "SGLang's FusedMoE, deep_gemm runner",
                   sms=frozenset({90}) | SM100S, needs=("deep_gemm",))
