"""MoE runner backends: the whole routed-expert layer (gate_up GEMM, SwiGLU, down GEMM, weighted
sum over top-k), compared across the runners SGLang can select with --moe-runner-backend.

Canonical weights are SGLang's: w13 [E, 2N, K] with the gate rows first, w2 [E, K, N]. FlashInfer's
CUTLASS MoE takes fc1 as [up; gate] (its SwiGLU convention), so that backend gets the halves
swapped, once. The reference is the float32 layer from the weights as the kernels see them
(dequantized for FP8 / NVFP4); NVFP4 backends also quantize the activations inside, which the
tolerance absorbs (a broken runner lands at ~100% error, a working NVFP4 one at ~10%).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from .backend_family import BackendFamily
from .triton_moe import TritonMoe, random_routing, sglang_align_block_size, sglang_selection

FP4_MAX, FP8_MAX = 6.0, 448.0


@dataclass
class MoeLayerInputs:
    problem: object
    M: int
    x: list                 # bf16 [M, K] per routing set
    topk_ids: list          # int32 [M, top_k]
    topk_weights: list      # float32 [M, top_k]
    w13: object             # as stored (bf16 / fp8 / packed fp4)
    w2: object
    dequant13: object       # expert -> float32 [2N, K]
    dequant2: object        # expert -> float32 [K, N]
    scales: dict = field(default_factory=dict)
    C: object = None
    cache: dict = field(default_factory=dict)


class _MoeLayerFamily(BackendFamily):
    dtype = ""              # Problem.dtype this family serves
    tol = 0.02

    def __init__(self, triton_config_dir: str | None = None, skip: tuple = ()):
        super().__init__(skip)
        # Where the Triton runner's configs come from: a tuned folder, or SGLang's own files.
        self.triton_config_dir = triton_config_dir
        self._triton = TritonMoe()

    def tolerance(self, problem, on_cpu: bool = False) -> float:
        return self.tol

    def unsupported_reason(self, problem, device):
        if problem.dtype != self.dtype:
            return f"{self.name} serves {self.dtype} experts, not {problem.dtype}"
        return super().unsupported_reason(problem, device)

    def availability(self, device):
        plan = super().availability(device)
        for a in plan:
            if a.ok and not hasattr(self, "run_" + a.backend.name.replace("-", "_")):
                a.ok, a.reason = False, "autotune has no runner for it yet"
        return plan

    # -- inputs -----------------------------------------------------------------------------------
    def _weights(self, problem, seed: int):
        """(w13, w2, dequant13, dequant2, scales) for this family's storage format."""
        import torch

        up = self._triton._weights(problem, "gate_up", seed, "cuda", torch.bfloat16)
        down = self._triton._weights(problem, "down", seed, "cuda", torch.bfloat16)
        return up[0], down[0], up[2], down[2], {"w13": up[1], "w2": down[1]}

    def make_inputs(self, problem, gemm, M, *, seed=0, skew=0.0, routings=10, on_cpu=False):
        import torch

        w13, w2, d13, d2, scales = self._weights(problem, seed)
        g = torch.Generator(device="cuda").manual_seed(seed * 7919 + M)
        ids, wts = random_routing(g, M, problem.E, problem.top_k, skew, routings)
        xs = [torch.randn(M, problem.K, generator=g, device="cuda").to(torch.bfloat16) for _ in range(routings)]
        return MoeLayerInputs(problem, M, xs, ids, wts, w13, w2, d13, d2, scales)

    def reference(self, inputs: MoeLayerInputs, config=None):
        """out[m] = sum_t w[m,t] * (silu(x W_gate^T) * (x W_up^T)) W_down^T over the chosen experts."""
        import torch

        p = inputs.problem
        x = inputs.x[0].float()
        ids = inputs.topk_ids[0].long()
        out = torch.zeros((inputs.M, p.K), dtype=torch.float32, device=x.device)
        for e in torch.unique(ids).tolist():
            m, t = (ids == e).nonzero(as_tuple=True)
            h = x[m] @ inputs.dequant13(e).T
            act = torch.nn.functional.silu(h[:, : p.N]) * h[:, p.N:]
            out.index_add_(0, m, (act @ inputs.dequant2(e).T) * inputs.topk_weights[0][m, t, None])
        return out

    # -- SGLang's Triton fused MoE, composed from its kernels -------------------------------------
    def run_triton(self, inputs: MoeLayerInputs, i: int, tactic: int):
        """Align, gate_up GEMM, SiLU-and-mul, down GEMM with routing weights, sum over top-k: the
        sequence SGLang's fused_experts runs, with the configs its loader picks (tuned folder or
        its shipped files). The final sum is torch's (SGLang's moe_sum_reduce is an sgl_kernel op)."""
        import torch
        import triton.language as tl
        from sglang.kernels.ops.activation import silu_and_mul
        from sglang.kernels.ops.moe.fused_moe_triton_kernels import invoke_fused_moe_kernel

        p = inputs.problem
        key = ("triton_cfg", inputs.M)
        if key not in inputs.cache:
            # The tuned folder where it has this shape's file (what the server will load with
            # SGLANG_MOE_CONFIG_DIR), else SGLang's own files: its shipped config or its default.
            up, down, found = sglang_selection(p, inputs.M, _device(), self.triton_config_dir)
            if not found:
                up, down, _ = sglang_selection(p, inputs.M, _device(), None)
            inputs.cache[key] = (up, down)
        up, down = inputs.cache[key]
        up, down = dict(up), dict(down)
        up_tma = bool(up.pop("USE_TMA", False))
        down.pop("USE_TMA", None)   # the composition below keeps the plain (unsorted) down layout
        fp8 = p.dtype.startswith("fp8")
        common = dict(compute_type=tl.bfloat16, use_fp8_w8a8=fp8, use_int8_w8a8=False, use_int8_w8a16=False,
                      use_int4_w4a16=False, per_channel_quant=False,
                      block_shape=list(p.block_shape) if p.block_shape else None, filter_expert=False)
        x, ids, w = inputs.x[i], inputs.topk_ids[i], inputs.topk_weights[i]
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

    # -- FlashInfer CUTLASS MoE --------------------------------------------------------------------
    def _fc1_up_gate(self, inputs: MoeLayerInputs, w, rows_per_half: int):
        """fc1 in FlashInfer's [up; gate] order (cached: weights are shared by all M)."""
        import torch

        key = ("fc1", id(w))
        if key not in inputs.cache:
            inputs.cache[key] = torch.cat([w[:, rows_per_half:], w[:, :rows_per_half]], dim=1).contiguous()
        return inputs.cache[key]


_DEVICE = []


def _device():
    """This worker's GPU (SGLang's loader answers per device name)."""
    if not _DEVICE:
        from ..device import detect
        _DEVICE.append(detect())
    return _DEVICE[0]


class MoeBf16(_MoeLayerFamily):
    name = "moe_bf16"
    dtype = "bf16"
    tol = 0.02

    def run_flashinfer_cutlass(self, inputs: MoeLayerInputs, i: int, tactic: int):
        import torch
        from flashinfer.fused_moe import cutlass_fused_moe

        p = inputs.problem
        out = cutlass_fused_moe(inputs.x[i], inputs.topk_ids[i], inputs.topk_weights[i],
                                self._fc1_up_gate(inputs, inputs.w13, p.N), inputs.w2, torch.bfloat16,
                                quant_scales=[])
        inputs.C = out[0] if isinstance(out, (list, tuple)) else out
        return inputs.C


class MoeFp8(_MoeLayerFamily):
    """Block [128, 128] FP8 experts (Qwen3.5 FP8 checkpoints); activations quantized per token
    group of 128 inside each runner."""

    name = "moe_fp8"
    dtype = "fp8_w8a8_block"
    tol = 0.08

    def run_flashinfer_cutlass(self, inputs: MoeLayerInputs, i: int, tactic: int):
        import torch
        from flashinfer.fused_moe import cutlass_fused_moe

        p = inputs.problem
        bn = p.block_shape[0]
        fc1 = self._fc1_up_gate(inputs, inputs.w13, p.N)
        s1 = self._fc1_up_gate(inputs, inputs.scales["w13"], -(-p.N // bn))
        out = cutlass_fused_moe(inputs.x[i], inputs.topk_ids[i], inputs.topk_weights[i], fc1, inputs.w2,
                                torch.bfloat16, quant_scales=[s1, inputs.scales["w2"]],
                                use_deepseek_fp8_block_scale=True)
        inputs.C = out[0] if isinstance(out, (list, tuple)) else out
        return inputs.C


class MoeFp4(_MoeLayerFamily):
    """NVFP4 experts (Qwen3.5 NVFP4 checkpoints): e2m1 weights, e4m3 scales per 16, a global scale
    per expert; quantized with FlashInfer's own fp4_quantize, dequantized by autotune.nvfp4 for
    the reference."""

    name = "moe_fp4"
    dtype = "nvfp4"
    tol = 0.3

    def _weights(self, problem, seed: int):
        import torch

        from .. import nvfp4

        key = (problem.key, seed)
        cache = self.__dict__.setdefault("_fp4_cache", {})
        if key not in cache:
            cache.clear()
            bf16 = replace(problem, dtype="bf16")
            w13 = self._triton._weights(bf16, "gate_up", seed, "cuda", torch.bfloat16)[0]
            w2 = self._triton._weights(bf16, "down", seed, "cuda", torch.bfloat16)[0]
            q13, sf13, gs13 = _fp4_per_expert(w13)
            q2, sf2, gs2 = _fp4_per_expert(w2)
            # FlashInfer's CUTLASS MoE wants fc1 as [up; gate]: quantized from the swapped weights
            # (swapping swizzled scale rows would break for N not a multiple of 128).
            up_gate = _fp4_per_expert(torch.cat([w13[:, problem.N:], w13[:, :problem.N]], dim=1), gs13)
            n2, k = 2 * problem.N, problem.K
            cache[key] = (q13, q2,
                          lambda e: nvfp4.dequantize(q13[e], sf13[e], gs13[e], n2, k),
                          lambda e: nvfp4.dequantize(q2[e], sf2[e], gs2[e], k, problem.N),
                          {"fc1": up_gate[0], "sf1": up_gate[1], "gs13": gs13, "sf2": sf2, "gs2": gs2})
        return cache[key]

    def run_flashinfer_cutlass(self, inputs: MoeLayerInputs, i: int, tactic: int):
        """FlashInfer's CUTLASS NVFP4 MoE as its tests drive it: bf16 activations (quantized
        inside with global scale 1), fc1 in [up; gate] order, 6 quant scales."""
        import torch
        from flashinfer.fused_moe import cutlass_fused_moe

        p, s = inputs.problem, inputs.scales
        one = torch.ones((), dtype=torch.float32, device=inputs.x[i].device)
        scales = [one, s["sf1"].view(torch.int32), 1.0 / (one * s["gs13"]), one, s["sf2"].view(torch.int32),
                  1.0 / (one * s["gs2"])]
        out = torch.empty((inputs.M, p.K), dtype=torch.bfloat16, device=inputs.x[i].device)
        cutlass_fused_moe(inputs.x[i], inputs.topk_ids[i], inputs.topk_weights[i], s["fc1"].view(torch.long),
                          inputs.w2.contiguous().view(torch.long), torch.bfloat16, quant_scales=scales, output=out)
        inputs.C = out
        return out


def _fp4_per_expert(w, global_scales=None):
    """FlashInfer's fp4_quantize per expert with the per-expert global scale 448 * 6 / amax."""
    import torch
    from flashinfer import fp4_quantize

    gs = global_scales if global_scales is not None else \
        (FP8_MAX * FP4_MAX) / w.float().abs().amax(dim=(1, 2)).clamp(min=1e-12)
    qs, sfs = zip(*(fp4_quantize(w[e], gs[e]) for e in range(w.shape[0])))
    return torch.stack(qs), torch.stack(sfs), gs
