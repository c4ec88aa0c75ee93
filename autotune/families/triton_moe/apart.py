"""The fused-MoE kernel compiled apart from the GPU that measures it (autotune.measure.builders).

A builder process holds no CUDA context. It runs SGLang's own call path (`TritonMoe.compile`:
`invoke_fused_moe_kernel`, its activation quantization included) on stand-in tensors, inside Triton's
cross-target runtime (autotune.families.triton_moe.cross_compile) and SGLang's view of that GPU
(autotune.adapters.sglang_compile), so the kernel lands in Triton's on-disk cache under the key the measuring
process's first launch looks up.

Triton specialises a launch on what the arguments are, never on their values: each tensor's dtype, rank and
whether its address is 16-byte aligned, each integer's divisibility by 16 and whether it is 1, the constexprs.
So the stand-ins are the measuring process's inputs in everything but content: the same shapes, strides and
dtypes, allocated uninitialised on the CPU (a weight tensor of several GiB costs address space, not memory:
nothing reads it). Where a stand-in specialised differently, the measuring process compiles that kernel
itself: slower, never wrong (the run reports that time as compile wait).
"""
from __future__ import annotations

import contextlib
import dataclasses

from autotune.contract.config import KernelConfig
from autotune.problems.models import Problem


def stand_in_inputs(family, problem: Problem, gemm: str, M: int):
    """Inputs shaped exactly as `family.make_inputs(problem, gemm, M)` shapes them on the GPU, one routing set,
    contents undefined; the block alignment is SGLang's wrapper's sizing (autotune.adapters.sglang_compile)."""
    import torch

    from autotune.families.triton_moe.inputs import MoeInputs

    N, K, k = problem.N, problem.K, problem.top_k
    B, B_scale = _weight_layout(family, problem, gemm)
    rows, in_dim = (M, K) if gemm == "gate_up" else (M * k, N)
    A = [torch.empty(rows, in_dim, dtype=torch.bfloat16)]
    C = torch.empty((M * k, 2 * N) if gemm == "gate_up" else (M, k, K), dtype=torch.bfloat16)
    ids = [torch.empty((M, k), dtype=torch.int32)]
    weights = [torch.empty((M, k), dtype=torch.float32)]
    return MoeInputs(problem, gemm, M, A, B, B_scale, None, C, ids, weights, on_cpu=False, stand_in=True)


def _weight_layout(family, problem: Problem, gemm: str):
    """(B, B_scale) with the GPU's dtypes, shapes and strides: the family's own quantization applied to one
    expert tells them, the E experts are then allocated uninitialised."""
    import torch

    rows, cols = (2 * problem.N, problem.K) if gemm == "gate_up" else (problem.K, problem.N)
    q, scale = family.quantize_weights(problem, torch.randn((1, rows, cols)), torch.bfloat16)

    def like(t):
        return None if t is None else torch.empty((problem.E, *t.shape[1:]), dtype=t.dtype)
    return like(q), like(scale)


@contextlib.contextmanager
def compiling_for(sm: int):
    """Every launch inside compiles SGLang's kernel for an sm_XY GPU (nothing runs), as SGLang decides it there."""
    from autotune.adapters.sglang_compile import compile_view
    from autotune.families.triton_moe.cross_compile import cross_target

    with cross_target(sm), compile_view(sm):
        yield


def compile_apart(family, config: KernelConfig, problem: Problem, gemm: str, M: int):
    """Compile `config` at batch size M inside `compiling_for` (Triton's compile errors raise here); returns
    Triton's compiled kernel (its `hash` is the key the measuring process's launch looks up)."""
    inputs = stand_in_inputs(family, problem, gemm, M)
    if gemm == "down" and config.get("USE_TMA"):
        # SGLang's TMA down GEMM reads A in the expert-sorted, block-padded layout, one row per slot of the
        # alignment buffer (TritonMoe._tma_sorted_A on the GPU)
        sorted_ids = family.aligned(inputs, config["BLOCK_SIZE_M"], 0)[0]
        inputs = dataclasses.replace(inputs, A=[inputs.A[0].new_empty((sorted_ids.shape[0], problem.N))])
        inputs._sorted_A[config["BLOCK_SIZE_M"], 0] = inputs.A[0]
    return family.compile(config, inputs)
