"""MoE runner backends: the whole routed-expert layer (gate_up GEMM, SwiGLU, down GEMM, weighted
sum over top-k), compared across the runners SGLang can select with --moe-runner-backend. Three
families (bf16, block-FP8, NVFP4 experts) share the inputs and the reference here; one module per
backend beside this one declares its runner for each family it serves (autotune.kernels.runner).

Canonical weights are SGLang's: w13 [E, 2N, K] with the gate rows first, w2 [E, K, N]. FlashInfer's
CUTLASS MoE takes fc1 as [up; gate] (its SwiGLU convention), so that backend gets the halves
swapped, once. The reference is the float32 layer from the weights as the kernels see them
(dequantized for FP8 / NVFP4); NVFP4 backends also quantize the activations inside, which the
tolerance absorbs (a broken runner lands at ~100% error, a working NVFP4 one at ~10%).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..backend_family import BackendFamily
from ..triton_moe import TritonMoe, random_routing

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
    triton_config_dir: str | None = None   # where SGLang's Triton runner finds configs (a tuned folder)
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
        return MoeLayerInputs(problem, M, xs, ids, wts, w13, w2, d13, d2, scales, self.triton_config_dir)

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


_DEVICE = []


def _device():
    """This worker's GPU (SGLang's loader answers per device name)."""
    if not _DEVICE:
        from ...device import detect
        _DEVICE.append(detect())
    return _DEVICE[0]


class MoeBf16(_MoeLayerFamily):
    name = "moe_bf16"
    dtype = "bf16"
    tol = 0.02


class MoeFp8(_MoeLayerFamily):
    """Block [128, 128] FP8 experts (Qwen3.5 FP8 checkpoints); activations quantized per token
    group of 128 inside each runner."""

    name = "moe_fp8"
    dtype = "fp8_w8a8_block"
    tol = 0.08


class MoeFp4(_MoeLayerFamily):
    """NVFP4 experts (Qwen3.5 NVFP4 checkpoints): e2m1 weights, e4m3 scales per 16, a global scale
    per expert; quantized with FlashInfer's own fp4_quantize, dequantized by autotune.nvfp4 for
    the reference."""

    name = "moe_fp4"
    dtype = "nvfp4"
    tol = 0.3

    def _weights(self, problem, seed: int):
        import torch

        from ... import nvfp4

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


def _fp4_per_expert(w, global_scales=None):
    """FlashInfer's fp4_quantize per expert with the per-expert global scale 448 * 6 / amax."""
    import torch
    from flashinfer import fp4_quantize

    gs = global_scales if global_scales is not None else \
        (FP8_MAX * FP4_MAX) / w.float().abs().amax(dim=(1, 2)).clamp(min=1e-12)
    qs, sfs = zip(*(fp4_quantize(w[e], gs[e]) for e in range(w.shape[0])))
    return torch.stack(qs), torch.stack(sfs), gs


def fc1_up_gate(inputs: MoeLayerInputs, w, rows_per_half: int):
    """fc1 in FlashInfer's [up; gate] order (cached: weights are shared by all M)."""
    import torch

    key = ("fc1", id(w))
    if key not in inputs.cache:
        inputs.cache[key] = torch.cat([w[:, rows_per_half:], w[:, :rows_per_half]], dim=1).contiguous()
    return inputs.cache[key]


def set_output(inputs: MoeLayerInputs, out):
    inputs.C = out[0] if isinstance(out, (list, tuple)) else out
    return inputs.C
