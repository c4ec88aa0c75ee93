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


def sglang_fused_finalize() -> bool:
    """What SGLang passes as cutlass_fused_moe's use_fused_finalize (False unless
    SGLANG_FLASHINFER_MOE_FUSED_FINALIZE is set; FlashInfer's own default is True)."""
    from sglang.srt.environ import envs

    flag = getattr(envs, "SGLANG_FLASHINFER_MOE_FUSED_FINALIZE", None)
    return True if flag is None else bool(flag.get())     # a release without the flag passes nothing


@dataclass(frozen=True)
class CutlassMoe(Runner):
    deepseek_fp8: bool = False          # use_deepseek_fp8_block_scale

    def _operands(self, inputs: MoeLayerInputs, routing: int) -> tuple:
        """(x, fc1 weights, fc2 weights, quant_scales, extra keyword arguments) of the call."""
        raise NotImplementedError

    def _moe_runner(self, inputs: MoeLayerInputs):
        """The MoERunner cutlass_fused_moe builds for this call."""
        import torch

        def make():
            x, fc1, _, _, _ = self._operands(inputs, 0)
            major, minor = torch.cuda.get_device_capability(x.device)
            return self.flashinfer_moe_runner(major * 10 + minor, x.dtype, fc1.dtype, inputs.topk_ids[0].size(1))
        return self.kept(inputs, "moe_runner", make)

    def flashinfer_moe_runner(self, sm: int, x_dtype, weight_dtype, top_k: int, tp_size: int = 1, ep_size: int = 1):
        """FlashInfer's MoERunner as cutlass_fused_moe builds it for SGLang's call (rank 0):
        SGLang's moe_runner/flashinfer_cutlass.py passes its moe TP and EP sizes and
        use_fused_finalize from SGLANG_FLASHINFER_MOE_FUSED_FINALIZE; the rest are FlashInfer's
        defaults. Its get_cache_key_extras names the cache key."""
        import torch
        from flashinfer.fused_moe.core import ActivationType, get_cutlass_fused_moe_module

        return get_cutlass_fused_moe_module(f"{sm}").MoERunner(
            x_dtype=x_dtype, weight_dtype=weight_dtype, output_dtype=torch.bfloat16, top_k=top_k,
            tp_size=tp_size, tp_rank=0, ep_size=ep_size, ep_rank=0, cluster_size=1, cluster_rank=0,
            enable_alltoall=False, use_deepseek_fp8_block_scale=self.deepseek_fp8, use_w4_group_scaling=False,
            use_mxfp8_act_scaling=False, min_latency_mode=False, enable_pdl=sm >= 90,
            activation_type=ActivationType.Swiglu, use_packed_weights=False,
            use_fused_finalize=sglang_fused_finalize(), use_wfp4afp8_humming=False)

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

    def _key_operands(self, problem, M: int) -> tuple[list, object, object]:
        """(shapes of choose_one's inputs [input, fc1, fc1 bias, fc2, fc2 bias], x dtype, weight dtype)
        as SGLang's flashinfer_cutlass runner passes them (moe_runner/flashinfer_cutlass.py), built
        from the problem alone (no weights needed to name a key)."""
        raise NotImplementedError(f"{self.family}: SGLang does not run this cutlass_fused_moe variant")

    def cache_entries(self, problem, M: int, tactic) -> list:
        """FlashInfer's entries for gemm1 and gemm2 of this pair at bucket M, one pair per (TP, EP)
        the problem is served at: SGLang passes moe_tp_size and moe_ep_size, and MoERunner puts them
        in its key (get_cache_key_extras), with the dtypes, top-k and activation. A part left at -1
        is pinned at -1 too, so start-up tuning does not pick an unchecked profile for it. None for
        a variant SGLang cannot select (its key would never be asked for) or M not a bucket."""
        import torch

        from ...export.flashinfer import CacheEntry, tuning_config_for

        if tactic == -1 or self.sglang_value is None:
            return []
        # SGLang passes tune_max_num_tokens = min(prefill tokens x attention DP, 8192): 8192 by default.
        cfg = tuning_config_for(GEMM_OPS[0], tune_max_num_tokens=8192)
        if cfg.dynamic_tensor_specs[0].map_to_tuning_buckets(M) != M:
            return []
        shapes, x_dtype, w_dtype = self._key_operands(problem, M)
        major, minor = torch.cuda.get_device_capability()        # the GPU the run measured on
        out = []
        for moe_tp, moe_ep in sorted({(tp // ep, ep) for _, tp, ep, *_ in problem.sources} or {(1, 1)}):
            runner = self.flashinfer_moe_runner(major * 10 + minor, x_dtype, w_dtype, problem.top_k, moe_tp, moe_ep)
            extras = runner.get_cache_key_extras(None)
            out += [CacheEntry.from_call(op, type(runner).__name__, shapes, cfg, int(t), extras)
                    for op, t in zip(GEMM_OPS, tactic)]
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
        extra = {**extra, "use_fused_finalize": sglang_fused_finalize()}     # as SGLang calls it
        if tactic != -1:
            extra = {**extra, "profile_ids": [int(t) for t in tactic]}
        out = cutlass_fused_moe(x, inputs.topk_ids[routing], inputs.topk_weights[routing], fc1, fc2,
                                torch.bfloat16, quant_scales=scales, **extra)
        return set_output(inputs, extra.get("output", out))


@dataclass(frozen=True)
class CutlassMoeBf16(CutlassMoe):
    def _operands(self, inputs, routing):
        return inputs.x[routing], fc1_up_gate(inputs, inputs.w13, inputs.problem.N), inputs.w2, [], {}

    def _key_operands(self, p, M):
        import torch
        return [(M, p.K), (p.E, 2 * p.N, p.K), (0,), (p.E, p.K, p.N), (0,)], torch.bfloat16, torch.bfloat16


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

    def _key_operands(self, p, M):
        """bf16 activations (SGLang quantizes them first only for its DP all-gather path, not keyed
        here); e2m1 weights packed two per byte, passed as int64 (16 per element), as SGLang does."""
        import torch
        return ([(M, p.K), (p.E, 2 * p.N, p.K // 16), (0,), (p.E, p.K, p.N // 16), (0,)],
                torch.bfloat16, torch.int64)


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
