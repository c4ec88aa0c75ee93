"""What one measurement of SGLang's fused-MoE kernel works on: one GEMM's operands at one batch size, per routing
set, with the block alignment and the TMA layouts made for it (autotune.families.triton_moe makes them, on the GPU;
autotune.families.triton_moe.apart makes stand-ins of the same shapes for a compile apart from it), and how the
experts' weights and the routing are made (the family's inputs and the layer check's share them). A module of
its own: the layer timing builds a layer from them without importing the family's package, which reaches it
through its hooks."""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

from autotune.numerics.fp8 import fp8_blocks, fp8_per_matrix
from autotune.problems.models import Problem


@dataclass
class MoeInputs:
    problem: Problem
    gemm: str
    M: int
    A: list            # activation per routing set
    B: object          # weights [E, 2N, K] (gate_up) or [E, K, N] (down)
    B_scale: object
    dequant: object    # expert index -> float32 weights as the kernel sees them
    C: object          # output buffer shared by all routing sets
    topk_ids: list
    topk_weights: list
    on_cpu: bool
    stand_in: bool = False   # shapes only, for a compile apart from the GPU (autotune.families.triton_moe.apart)
    _aligned: dict = field(default_factory=dict)
    _sorted_A: dict = field(default_factory=dict)
    _ref: object = None


def compute_dtype(problem: Problem, on_cpu: bool):
    import torch
    return torch.float32 if on_cpu else torch.bfloat16


def quantized(problem: Problem, w, cdt):
    """bf16 weights as is; FP8 weights with a per-block (128x128) or per-expert scale."""
    if problem.dtype == "bf16":
        return w.to(cdt), None
    if problem.block_shape:
        return fp8_blocks(w, problem.block_shape)
    return fp8_per_matrix(w)


def expert_weights(problem: Problem, gemm: str, seed: int, dev: str, cdt):
    """(B, B_scale, dequant(e) -> float32 [rows, cols] of expert e): random weights of every expert of one GEMM,
    made on `dev` and quantized as the kernel takes them."""
    import torch

    E, N, K = problem.E, problem.N, problem.K
    rows, cols = (2 * N, K) if gemm == "gate_up" else (K, N)
    g = torch.Generator(device=dev).manual_seed(seed * 104729 + (gemm == "down"))
    parts, scales = [], []
    for e0 in range(0, E, 32):   # chunks bound the float32 temporaries
        w = torch.randn((min(32, E - e0), rows, cols), generator=g, device=dev) / cols ** 0.5
        q, sc = quantized(problem, w, cdt)
        parts.append(q)
        scales.append(sc)
        del w
    B = torch.cat(parts)
    B_scale = torch.cat(scales) if scales[0] is not None else None
    return B, B_scale, functools.partial(_dequant, problem, B, B_scale)


def random_routing(g, M: int, E: int, k: int, skew: float, sets: int):
    """`sets` routings of M tokens: softmax top-k of random logits, renormalised; `skew` > 0 adds
    a per-expert bias of that many standard deviations (hot experts)."""
    import torch

    bias = torch.randn(E, generator=g, device=g.device) * skew
    ids, wts = [], []
    for _ in range(sets):
        w, i = torch.topk(torch.softmax(torch.randn(M, E, generator=g, device=g.device) + bias, dim=-1), k, dim=-1)
        ids.append(i.to(torch.int32))
        wts.append((w / w.sum(-1, keepdim=True)).float())
    return ids, wts


def _dequant(problem: Problem, B, B_scale, e: int):
    w = B[e].float()
    if B_scale is None:
        return w
    if problem.block_shape:
        bn, bk = problem.block_shape
        s = B_scale[e].repeat_interleave(bn, 0).repeat_interleave(bk, 1)[: w.shape[0], : w.shape[1]]
        return w * s
    return w * B_scale[e]
