"""FlashInfer's CUTLASS fused MoE (flashinfer.fused_moe.cutlass_fused_moe) for bf16, block-FP8 and
NVFP4 experts; its tactics are the gemm1/gemm2 CUTLASS profiles of FlashInfer's MoE runner."""
from dataclasses import dataclass

from ...backends import HOPPER_AND_UP
from ..runner import Runner
from . import MoeLayerInputs, fc1_up_gate, set_output


@dataclass(frozen=True)
class CutlassMoeBf16(Runner):
    def run(self, inputs: MoeLayerInputs, routing: int, tactic: int = -1):
        import torch
        from flashinfer.fused_moe import cutlass_fused_moe

        p = inputs.problem
        return set_output(inputs, cutlass_fused_moe(
            inputs.x[routing], inputs.topk_ids[routing], inputs.topk_weights[routing],
            fc1_up_gate(inputs, inputs.w13, p.N), inputs.w2, torch.bfloat16, quant_scales=[]))


@dataclass(frozen=True)
class CutlassMoeFp8(Runner):
    """Block [128, 128] FP8 experts with DeepSeek-style block scales; activations quantized per
    token group of 128 inside."""

    def run(self, inputs: MoeLayerInputs, routing: int, tactic: int = -1):
        import torch
        from flashinfer.fused_moe import cutlass_fused_moe

        p = inputs.problem
        fc1 = fc1_up_gate(inputs, inputs.w13, p.N)
        s1 = fc1_up_gate(inputs, inputs.scales["w13"], -(-p.N // p.block_shape[0]))
        return set_output(inputs, cutlass_fused_moe(
            inputs.x[routing], inputs.topk_ids[routing], inputs.topk_weights[routing], fc1, inputs.w2,
            torch.bfloat16, quant_scales=[s1, inputs.scales["w2"]], use_deepseek_fp8_block_scale=True))


@dataclass(frozen=True)
class CutlassMoeFp4(Runner):
    """As FlashInfer's tests drive it: bf16 activations (quantized inside with global scale 1),
    fc1 in [up; gate] order, 6 quant scales."""

    def run(self, inputs: MoeLayerInputs, routing: int, tactic: int = -1):
        import torch
        from flashinfer.fused_moe import cutlass_fused_moe

        p, s, x = inputs.problem, inputs.scales, inputs.x[routing]
        one = torch.ones((), dtype=torch.float32, device=x.device)
        scales = [one, s["sf1"].view(torch.int32), 1.0 / (one * s["gs13"]), one, s["sf2"].view(torch.int32),
                  1.0 / (one * s["gs2"])]
        out = torch.empty((inputs.M, p.K), dtype=torch.bfloat16, device=x.device)
        cutlass_fused_moe(x, inputs.topk_ids[routing], inputs.topk_weights[routing], s["fc1"].view(torch.long),
                          inputs.w2.contiguous().view(torch.long), torch.bfloat16, quant_scales=scales, output=out)
        return set_output(inputs, out)


RUNNERS = (
    CutlassMoeFp4("moe_fp4", "flashinfer_cutlass", "flashinfer_cutlass", "flashinfer.cutlass_fused_moe (nvfp4)",
                  sms=frozenset({100, 103, 110, 120, 121}), tunable=True),
    # FlashInfer's block-scale FP8 CUTLASS MoE exists for SM90 only; SGLang's Fp8MoEMethod has no
    # flashinfer_cutlass path (it falls back to triton), so it is measured for reference.
    CutlassMoeFp8("moe_fp8", "flashinfer_cutlass", None, "flashinfer.cutlass_fused_moe (fp8 block, deepseek scales)",
                  sms=frozenset({90}), tunable=True),
    CutlassMoeBf16("moe_bf16", "flashinfer_cutlass", "flashinfer_cutlass", "flashinfer.cutlass_fused_moe (bf16)",
                   sms=frozenset({89}) | HOPPER_AND_UP, tunable=True),
)
