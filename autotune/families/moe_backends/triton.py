"""SGLang's Triton fused MoE, --moe-runner-backend triton, through SGLang's MoE block, with the
configs its loader picks: the tuned folder's where it has this shape's file (what the server loads
with SGLANG_MOE_CONFIG_DIR), else SGLang's shipped config or its default. SGLang's NVFP4 method
has no Triton path: declared for moe_fp4 too, so the run shows SGLang's own answer."""
from autotune.contract.capabilities import HOPPER_AND_UP
from autotune.families.moe_backends import SglangMoe

RUNNERS = (
    SglangMoe("moe_fp8", "triton", "triton", "SGLang's FusedMoE, triton runner (tuned configs)",
              sms=frozenset({89}) | HOPPER_AND_UP, needs=("sglang",)),
    SglangMoe("moe_bf16", "triton", "triton", "SGLang's FusedMoE, triton runner (tuned configs)",
              sms=frozenset({80, 86, 89}) | HOPPER_AND_UP, needs=("sglang",)),
    SglangMoe("moe_fp4", "triton", "triton", "SGLang's FusedMoE, triton runner",
              known_failures=(((80, 86, 89, 90, 100, 103, 110, 120, 121),
                               "SGLang's ModelOpt NVFP4 MoE method has no Triton path (modelopt_quant.py apply: "
                               "'Unsupported moe_runner_backend for NVFP4 MoE')"),)),
)
