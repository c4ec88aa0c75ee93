"""What one measurement of SGLang's fused-MoE kernel works on: one GEMM's operands at one batch size, per routing
set, with the block alignment and the TMA layouts made for it (autotune.families.triton_moe makes them, on the GPU;
autotune.families.triton_moe.apart makes stand-ins of the same shapes for a compile apart from it)."""
from __future__ import annotations

from dataclasses import dataclass, field

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
