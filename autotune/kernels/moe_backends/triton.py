"""SGLang's Triton fused MoE, --moe-runner-backend triton (bf16 and block-FP8 experts), with the
configs its loader picks: the tuned folder's where it has this shape's file (what the server loads
with SGLANG_MOE_CONFIG_DIR), else SGLang's shipped config or its default."""
from dataclasses import dataclass

from ...backends import HOPPER_AND_UP
from ..runner import Runner
from ..sglang_loader import sglang_selection
from ..triton_moe import sglang_align_block_size
from . import MoeLayerInputs, _device


@dataclass(frozen=True)
class SglangTritonMoe(Runner):
    def run(self, inputs: MoeLayerInputs, routing: int, tactic: int = -1):
        """Align, gate_up GEMM, SiLU-and-mul, down GEMM with routing weights, sum over top-k: the
        sequence SGLang's fused_experts runs. The final sum is torch's (SGLang's moe_sum_reduce is
        an sgl_kernel op)."""
        import torch
        import triton.language as tl
        from sglang.kernels.ops.activation import silu_and_mul
        from sglang.kernels.ops.moe.fused_moe_triton_kernels import invoke_fused_moe_kernel

        p = inputs.problem
        key = ("triton_cfg", inputs.M)
        if key not in inputs.cache:
            up, down, found = sglang_selection(p, inputs.M, _device(), inputs.triton_config_dir)
            if not found:
                up, down, _ = sglang_selection(p, inputs.M, _device(), None)
            inputs.cache[key] = (up, down)
        up, down = (dict(c) for c in inputs.cache[key])
        up_tma = bool(up.pop("USE_TMA", False))
        down.pop("USE_TMA", None)   # the composition below keeps the plain (unsorted) down layout
        fp8 = p.dtype.startswith("fp8")
        common = dict(compute_type=tl.bfloat16, use_fp8_w8a8=fp8, use_int8_w8a8=False, use_int8_w8a16=False,
                      use_int4_w4a16=False, per_channel_quant=False,
                      block_shape=list(p.block_shape) if p.block_shape else None, filter_expert=False)
        x, ids, w = inputs.x[routing], inputs.topk_ids[routing], inputs.topk_weights[routing]
        sorted_ids, expert_ids, ntp = sglang_align_block_size(ids, up["BLOCK_SIZE_M"], p.E)
        cache1 = torch.empty((inputs.M * p.top_k, 2 * p.N), dtype=torch.bfloat16, device=x.device)
        invoke_fused_moe_kernel(x, inputs.w13, None, cache1, None, inputs.scales.get("w13"), None, w, ids,
                                sorted_ids, expert_ids, ntp, False, p.top_k, up, b_use_tma=up_tma, **common)
        cache2 = silu_and_mul(cache1)
        cache3 = torch.empty((inputs.M, p.top_k, p.K), dtype=torch.bfloat16, device=x.device)
        invoke_fused_moe_kernel(cache2, inputs.w2, None, cache3, None, inputs.scales.get("w2"), None, w, ids,
                                sorted_ids, expert_ids, ntp, True, 1, down, router_topk=p.top_k, **common)
        inputs.C = cache3.sum(dim=1)
        return inputs.C


RUNNERS = (
    SglangTritonMoe("moe_fp8", "triton", "triton", "SGLang fused_moe Triton kernel (tuned configs)",
                    sms=frozenset({89}) | HOPPER_AND_UP, needs=("sglang",)),
    SglangTritonMoe("moe_bf16", "triton", "triton", "SGLang fused_moe Triton kernel (tuned configs)",
                    sms=frozenset({80, 86, 89}) | HOPPER_AND_UP, needs=("sglang",)),
)
