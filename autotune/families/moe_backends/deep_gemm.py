"""DeepGEMM's grouped FP8 GEMMs through SGLang's MoE block, --moe-runner-backend deep_gemm (block-FP8
experts); needs the deep_gemm package."""
from autotune.gpus.catalog import SM100S
from autotune.families.moe_backends import SglangMoe

RUNNER = SglangMoe("moe_fp8", "deep_gemm", "deep_gemm", "SGLang's FusedMoE, deep_gemm runner",
                   sms=frozenset({90}) | SM100S, needs=("deep_gemm",))
