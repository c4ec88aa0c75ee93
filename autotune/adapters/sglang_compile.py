"""SGLang's fused-MoE launch decided as on a GPU of a given architecture, in a process that has none.

A process that compiles for the GPU without holding it (autotune.measure.builders) runs SGLang's own call path
(`invoke_fused_moe_kernel`) on stand-in tensors with Triton's launches turned into compiles. For the kernel it
builds to be the one the measuring process's launch looks up in Triton's cache, every decision SGLang takes
from the machine must be the GPU's:
- its JIT architecture (`sglang.kernels.jit.utils`): from SM90 on SGLang launches the MoE kernel with
  programmatic dependent launch (USE_GDC, GDC_EARLY: other constexprs, another binary). Without a GPU SGLang
  reads the capability as 0.0 and would compile the kernel without them;
- its block alignment buffers: SGLang's wrapper sizes sorted_token_ids from the token and expert counts and
  the block size (the kernel is specialised on that length), then calls a CUDA op. The wrapper's sizing runs
  as it is; the op is not called (a compile reads shapes, never values).
"""
from __future__ import annotations

import contextlib

from autotune.adapters.sglang_loader import triton_utils_module

_JIT_UTILS = "sglang.kernels.jit.utils"


@contextlib.contextmanager
def compile_view(sm: int):
    """SGLang's launch decisions as on an sm_XY GPU (capability XY // 10, XY % 10), for what runs inside."""
    import importlib

    arch_mod = importlib.import_module(f"{_JIT_UTILS}.arch")
    wrapper = triton_utils_module("moe_align_block_size")
    had_op = hasattr(wrapper, "sgl_moe_align_block_size")
    saved_op = getattr(wrapper, "sgl_moe_align_block_size", None)
    wrapper.sgl_moe_align_block_size = _sizes_only
    try:
        with arch_mod.override_jit_cuda_arch(sm // 10, sm % 10):
            _forget_pdl_answer(arch_mod)
            yield
    finally:
        _forget_pdl_answer(arch_mod)
        if had_op:
            wrapper.sgl_moe_align_block_size = saved_op
        else:
            del wrapper.sgl_moe_align_block_size


def _sizes_only(*operands) -> None:
    """The alignment op's place in SGLang's wrapper: the buffers it was handed keep their sizes."""


def _forget_pdl_answer(arch_mod) -> None:
    """`is_arch_support_pdl` remembers its first answer (SGLang's `cache_once`): a process that asked it
    before the architecture was set must ask again. Its remembered answers live in the wrapper's closure."""
    fn = arch_mod.is_arch_support_pdl
    for cell in getattr(fn, "__closure__", None) or ():
        if isinstance(cell.cell_contents, dict):
            cell.cell_contents.clear()
