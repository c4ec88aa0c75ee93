"""FlashInfer's CUTLASS fused MoE, --moe-runner-backend flashinfer_cutlass, through SGLang's MoE
block for bf16, block-FP8 and NVFP4 experts (SGLang's own flashinfer_cutlass runner calls
flashinfer.fused_moe.cutlass_fused_moe with the layouts its quant method made).

Its tactics are a pair: a CUTLASS profile for gemm1 and one for gemm2, which FlashInfer's AutoTuner
tunes as two ops ("trtllm::fused_moe::gemm1" / "gemm2"). They are listed from the MoERunner object
cutlass_fused_moe builds for SGLang's call, one axis at a time ([g1, -1] and [-1, g2]: -1 is that
GEMM's default); the search core then measures the pair of each axis's best (Runner.tactic_axes).
A tactic is launched pinned through FlashInfer's cache, the file the tuned folder ships, and the
launch checks that FlashInfer handed it out (runner.flashinfer_pin)."""
from dataclasses import dataclass

from autotune.contract.capabilities import HOPPER_AND_UP
from autotune.contract.runner import flashinfer_pin
from autotune.families.moe_backends import MoeLayerInputs, SglangMoe

GEMM_OPS = ("trtllm::fused_moe::gemm1", "trtllm::fused_moe::gemm2")


def sglang_fused_finalize() -> bool:
    """What SGLang passes as cutlass_fused_moe's use_fused_finalize (False unless
    SGLANG_FLASHINFER_MOE_FUSED_FINALIZE is set; FlashInfer's own default is True)."""
    from sglang.srt.environ import envs

    flag = getattr(envs, "SGLANG_FLASHINFER_MOE_FUSED_FINALIZE", None)
    return True if flag is None else bool(flag.get())     # a release without the flag passes nothing


@dataclass(frozen=True)
class CutlassMoe(SglangMoe):
    deepseek_fp8: bool = False          # use_deepseek_fp8_block_scale

    def _operands(self, inputs: MoeLayerInputs) -> list:
        """choose_one's inputs [input, fc1, fc1 bias, fc2, fc2 bias] as SGLang's call passes them:
        the block's processed expert weights (NVFP4 ones as int64, 16 e2m1 per element)."""
        import torch

        experts = self.block(inputs).experts
        fc1, fc2 = experts.w13_weight, experts.w2_weight
        if fc1.dtype == torch.uint8:
            fc1, fc2 = fc1.view(torch.long), fc2.contiguous().view(torch.long)
        return [inputs.x[0], fc1, None, fc2, None]

    def _moe_runner(self, inputs: MoeLayerInputs):
        """The MoERunner cutlass_fused_moe builds for this call."""
        import torch

        def make():
            x, fc1 = self._operands(inputs)[:2]
            major, minor = torch.cuda.get_device_capability(x.device)
            return self.flashinfer_moe_runner(major * 10 + minor, x.dtype, fc1.dtype, inputs.problem.top_k)
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
        runner, ops = self._moe_runner(inputs), self._operands(inputs)
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
        if tactic == -1 or self.sglang_value is None:
            return []
        from autotune.adapters.flashinfer_cache import tuning_config_for

        if tuning_config_for(GEMM_OPS[0], tune_max_num_tokens=8192).dynamic_tensor_specs[0].map_to_tuning_buckets(M) != M:
            return []
        sizes = sorted({(tp // ep, ep) for _, tp, ep, *_ in problem.sources} or {(1, 1)})
        return self._entries(problem, M, tactic, sizes)

    def _entries(self, problem, M: int, tactic, sizes) -> list:
        """The gemm1 and gemm2 entries of `tactic` for M's bucket, one pair per (moe TP, moe EP)."""
        import torch

        from autotune.adapters.flashinfer_cache import CacheEntry, tuning_config_for

        # SGLang passes tune_max_num_tokens = min(prefill tokens x attention DP, 8192): 8192 by default.
        cfg = tuning_config_for(GEMM_OPS[0], tune_max_num_tokens=8192)
        shapes, x_dtype, w_dtype = self._key_operands(problem, M)
        major, minor = torch.cuda.get_device_capability()        # the GPU the run measured on
        tactic = [-1, -1] if tactic == -1 else tactic
        out = []
        for moe_tp, moe_ep in sizes:
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

    def pinned(self, inputs: MoeLayerInputs, tactic):
        """Every launch pinned, -1 too (an earlier tactic's entry must not stay served): the layer is
        one rank at TP = EP = 1, so its call's key is the (1, 1) entry."""
        tactic = [-1, -1] if tactic == -1 else [int(t) for t in tactic]
        return flashinfer_pin(self._entries(inputs.problem, inputs.M, tactic, [(1, 1)]), tactic)


@dataclass(frozen=True)
class CutlassMoeBf16(CutlassMoe):
    def _key_operands(self, p, M):
        import torch
        return [(M, p.K), (p.E, 2 * p.N, p.K), (0,), (p.E, p.K, p.N), (0,)], torch.bfloat16, torch.bfloat16


@dataclass(frozen=True)
class CutlassMoeFp4(CutlassMoe):
    """NVFP4 experts (ModelOpt): SGLang's call passes bf16 activations, quantized inside."""

    def _key_operands(self, p, M):
        """bf16 activations (SGLang quantizes them first only for its DP all-gather path, not keyed
        here); e2m1 weights packed two per byte, passed as int64 (16 per element), as SGLang does."""
        import torch
        return ([(M, p.K), (p.E, 2 * p.N, p.K // 16), (0,), (p.E, p.K, p.N // 16), (0,)],
                torch.bfloat16, torch.int64)


RUNNERS = (
    CutlassMoeFp4("moe_fp4", "flashinfer_cutlass", "flashinfer_cutlass", "flashinfer.cutlass_fused_moe (nvfp4)",
                  sms=frozenset({100, 103, 110, 120, 121}), tunable=True, tactic_axes=2),
    # SGLang 0.5.23's Fp8MoEMethod serves this flag with its triton runner (the launch says so, as
    # a refusal); FlashInfer's block-FP8 CUTLASS MoE is SM90-only and SGLang does not call it.
    SglangMoe("moe_fp8", "flashinfer_cutlass", "flashinfer_cutlass", "SGLang's FusedMoE, flashinfer_cutlass runner",
              sms=frozenset({90})),
    CutlassMoeBf16("moe_bf16", "flashinfer_cutlass", "flashinfer_cutlass", "flashinfer.cutlass_fused_moe (bf16)",
                   sms=frozenset({89}) | HOPPER_AND_UP, tunable=True, tactic_axes=2),
)
