"""Block alignment of routed tokens, as SGLang's fused MoE does it before its GEMMs: SGLang's own
op on a GPU, a CPU stand-in of it under Triton's interpreter (the tests, cross-compiles)."""
from __future__ import annotations

from autotune.adapters.sglang_loader import triton_utils_module


def sglang_align_block_size(topk_ids, block_m: int, num_experts: int):
    """SGLang's moe_align_block_size wrapper (buffer sizing, small-batch Triton path) as the
    server calls it. Where the AOT sgl_kernel package is absent, its generic path is pointed at
    the JIT build of the same op that SGLang registers for CUDA."""
    wrapper_mod = triton_utils_module("moe_align_block_size")

    if not getattr(wrapper_mod, "_autotune_jit_align", False):
        try:
            import sgl_kernel  # noqa: F401
        except Exception:
            from sglang.kernels.ops.moe.moe_align import moe_align_block_size as jit_align

            # It stands in for sgl_kernel's op, which SGLang's wrapper calls with nine positional operands
            # (moe_align_block_size.py: topk_ids, num_experts + 1, block_size, sorted_ids, expert_ids,
            # num_tokens_post_pad, cumsum_buffer, pad, ignore_invalid_expert); the JIT op takes the first
            # eight, and has no way to ignore invalid experts.
            def aot_compatible(*operands):
                if len(operands) > 8 and operands[8]:
                    raise RuntimeError("ignore_invalid_expert needs sgl_kernel")
                jit_align(*operands[:8])

            wrapper_mod.sgl_moe_align_block_size = aot_compatible
        wrapper_mod._autotune_jit_align = True
    return wrapper_mod.moe_align_block_size(topk_ids, block_m, num_experts)


def sglang_alignment_buffers(topk_ids, block_m: int, num_experts: int):
    """SGLang's wrapper as the GPU runs it, inside autotune.adapters.sglang_compile.compile_view: the buffers
    it sizes, their contents never computed (a compile apart from the GPU reads shapes only)."""
    return triton_utils_module("moe_align_block_size").moe_align_block_size(topk_ids, block_m, num_experts)


def cpu_align_block_size(topk_ids, block_m: int, num_experts: int):
    """CPU stand-in for the CUDA alignment op (used only under Triton's interpreter): each
    expert's (token, slot) ids sorted together and padded to a multiple of block_m with the
    sentinel numel; one expert id per block; the padded total."""
    import torch

    flat = topk_ids.reshape(-1).long()
    numel = flat.numel()
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=num_experts)
    sorted_ids, expert_ids, start = [], [], 0
    for e in range(num_experts):
        c = int(counts[e])
        if not c:
            continue
        ids = order[start:start + c].tolist() + [numel] * ((-c) % block_m)
        start += c
        sorted_ids += ids
        expert_ids += [e] * (len(ids) // block_m)
    ntp = len(sorted_ids)
    return (torch.tensor(sorted_ids, dtype=torch.int32), torch.tensor(expert_ids, dtype=torch.int32),
            torch.tensor([ntp], dtype=torch.int32))
