"""FlashInfer's CUTLASS fused MoE (flashinfer.fused_moe.cutlass_fused_moe) for bf16, block-FP8 and
NVFP4 experts. Its tactics are a pair: a CUTLASS profile for gemm1 and one for gemm2, which
FlashInfer's AutoTuner tunes as two ops ("trtllm::fused_moe::gemm1" / "gemm2") and the public call
pins with `profile_ids=[gemm1, gemm2]`. They are listed from the MoERunner object cutlass_fused_moe
itself builds, one axis at a time ([g1, -1] and [-1, g2]: -1 is that GEMM's default); the search
core then measures the pair of each axis's best (Runner.tactic_axes)."""
from dataclasses import dataclass

from ...backends import HOPPER_AND_UP
from ..runner import Runner
from . import MoeLayerInputs, fc1_up_gate, set_output

GEMM_OPS = ("trtllm::fused_moe::gemm1", "trtllm::fused_moe::gemm2")


@dataclass(frozen=True)
class CutlassMoe(Runner):
    deepseek_fp8: bool = False          # use_deepseek_fp8_block_scale

    def _operands(self, inputs: MoeLayerInputs, routing: int) -> tuple:
        """(x, fc1 weights, fc2 weights, quant_scales, extra keyword arguments) of the call."""
        raise NotImplementedError

    def _moe_runner(self, inputs: MoeLayerInputs):
        """The MoERunner cutlass_fused_moe builds for this call (same arguments as its defaults)."""
        import torch
        from flashinfer.fused_moe.core import ActivationType, get_cutlass_fused_moe_module
        from flashinfer.utils import device_support_pdl

        if "moe_runner" not in inputs.cache:
            x, fc1, _, _, _ = self._operands(inputs, 0)
            major, minor = torch.cuda.get_device_capability(x.device)
            inputs.cache["moe_runner"] = get_cutlass_fused_moe_module(f"{major * 10 + minor}").MoERunner(
                x_dtype=x.dtype, weight_dtype=fc1.dtype, output_dtype=torch.bfloat16,
                top_k=inputs.topk_ids[0].size(1), tp_size=1, tp_rank=0, ep_size=1, ep_rank=0, cluster_size=1,
                cluster_rank=0, enable_alltoall=False, use_deepseek_fp8_block_scale=self.deepseek_fp8,
                use_w4_group_scaling=False, use_mxfp8_act_scaling=False, min_latency_mode=False,
                enable_pdl=device_support_pdl(x.device), activation_type=ActivationType.Swiglu,
                use_packed_weights=False, use_fused_finalize=True, use_wfp4afp8_humming=False)
        return inputs.cache["moe_runner"]

    def tactics(self, inputs: MoeLayerInputs) -> list:
        x, fc1, fc2, _, _ = self._operands(inputs, 0)
        runner, ops = self._moe_runner(inputs), [x, fc1, None, fc2, None]
        out: list = [-1]
        for axis in (0, 1):
            runner.gemm_idx_for_tuning = axis + 1       # what cutlass_fused_moe sets before each choose_one
            for t in runner.get_valid_tactics(ops, None):
                if int(t) != -1:
                    pair = [-1, -1]
                    pair[axis] = int(t)
                    out.append(pair)
        return out

    def blocklist_keys(self, tactic) -> list[tuple[str, object]]:
        """("op::RunnerClass", tactic) of the GEMM a one-axis pair varies; a pair of two non-default
        profiles that fails names no single culprit and is left out."""
        if tactic == -1 or sum(t != -1 for t in tactic) != 1:
            return []
        axis = 0 if tactic[0] != -1 else 1
        return [(f"{GEMM_OPS[axis]}::MoERunner", tactic[axis])]

    def run(self, inputs: MoeLayerInputs, routing: int, tactic=-1):
        import torch
        from flashinfer.fused_moe import cutlass_fused_moe

        x, fc1, fc2, scales, extra = self._operands(inputs, routing)
        if tactic != -1:
            extra = {**extra, "profile_ids": [int(t) for t in tactic]}
        out = cutlass_fused_moe(x, inputs.topk_ids[routing], inputs.topk_weights[routing], fc1, fc2,
                                torch.bfloat16, quant_scales=scales, **extra)
        return set_output(inputs, extra.get("output", out))


@dataclass(frozen=True)
class CutlassMoeBf16(CutlassMoe):
    def _operands(self, inputs, routing):
        return inputs.x[routing], fc1_up_gate(inputs, inputs.w13, inputs.problem.N), inputs.w2, [], {}


@dataclass(frozen=True)
class CutlassMoeFp8(CutlassMoe):
    """Block [128, 128] FP8 experts with DeepSeek-style block scales; activations quantized per
    token group of 128 inside."""

    def _operands(self, inputs, routing):
        p = inputs.problem
        fc1 = fc1_up_gate(inputs, inputs.w13, p.N)
        s1 = fc1_up_gate(inputs, inputs.scales["w13"], -(-p.N // p.block_shape[0]))
        return inputs.x[routing], fc1, inputs.w2, [s1, inputs.scales["w2"]], {"use_deepseek_fp8_block_scale": True}


@dataclass(frozen=True)
class CutlassMoeFp4(CutlassMoe):
    """As FlashInfer's tests drive it: bf16 activations (quantized inside with global scale 1),
    fc1 in [up; gate] order, 6 quant scales."""

    def _operands(self, inputs, routing):
        import torch

        p, s, x = inputs.problem, inputs.scales, inputs.x[routing]
        one = torch.ones((), dtype=torch.float32, device=x.device)
        scales = [one, s["sf1"].view(torch.int32), 1.0 / (one * s["gs13"]), one, s["sf2"].view(torch.int32),
                  1.0 / (one * s["gs2"])]
        key = ("out", routing)
        if key not in inputs.cache:
            inputs.cache[key] = torch.empty((inputs.M, p.K), dtype=torch.bfloat16, device=x.device)
        return (x, s["fc1"].view(torch.long), inputs.w2.contiguous().view(torch.long), scales,
                {"output": inputs.cache[key]})


RUNNERS = (
    CutlassMoeFp4("moe_fp4", "flashinfer_cutlass", "flashinfer_cutlass", "flashinfer.cutlass_fused_moe (nvfp4)",
                  sms=frozenset({100, 103, 110, 120, 121}), tunable=True, tactic_axes=2),
    # FlashInfer's block-scale FP8 CUTLASS MoE exists for SM90 only; SGLang's Fp8MoEMethod has no
    # flashinfer_cutlass path (it falls back to triton), so it is measured for reference.
    CutlassMoeFp8("moe_fp8", "flashinfer_cutlass", None, "flashinfer.cutlass_fused_moe (fp8 block, deepseek scales)",
                  sms=frozenset({90}), tunable=True, tactic_axes=2, deepseek_fp8=True),
    CutlassMoeBf16("moe_bf16", "flashinfer_cutlass", "flashinfer_cutlass", "flashinfer.cutlass_fused_moe (bf16)",
                   sms=frozenset({89}) | HOPPER_AND_UP, tunable=True, tactic_axes=2),
)
