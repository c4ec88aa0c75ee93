"""SGLang's Marlin MoE through its MoE block, --moe-runner-backend marlin: weight-only kernels
(activations stay bf16). For NVFP4 experts it is SGLang's auto on SM80-SM99, where no FP4 tensor
cores exist (W4A16: its quant method repacks the e2m1 weights); for block-FP8 experts, W8A16.
Its kernels are SGLang's JIT builds (moe_wna16_marlin, nvcc at first use: over 270 s on the H200)."""
from autotune.families.moe_backends import SglangMoe

_SMS = frozenset({80, 86, 89, 90, 100, 103, 110, 120, 121})
RUNNERS = (
    SglangMoe("moe_fp4", "marlin", "marlin", "SGLang's FusedMoE, marlin runner (nvfp4 W4A16)", sms=_SMS),
    SglangMoe("moe_fp8", "marlin", "marlin", "SGLang's FusedMoE, marlin runner (fp8 W8A16)", sms=_SMS),
)
