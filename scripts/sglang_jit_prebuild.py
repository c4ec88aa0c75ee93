#!/usr/bin/env python3
"""Builds, all at once, the SGLang JIT modules its marlin NVFP4 paths reach on this GPU, into
$SGLANG_JIT_CACHE_DIR (scripts/device_steps.sh packs that cache, without object files, for a later call to carry:
SGLang's loader reuses a leaf from its .so and sgl_deps.json alone, sglang/kernels/jit/utils/compile/cache.py).

One at a time on first use, the two `moe_wna16_marlin` variants and FP4 GEMM's gptq_marlin outlast a 10-minute
device call (session 16); SGLang's own `parallel_compile` builds them side by side (~5 min on 16 cores).

  SGLANG_JIT_CACHE_DIR=/tmp/sgjit python3 scripts/sglang_jit_prebuild.py
"""
import functools, os, sys, time


def builders():
    import torch
    from sglang.kernels.ops.gemm.gptq_marlin import _jit_gptq_marlin_module
    from sglang.kernels.ops.moe.moe_wna16_marlin import _jit_moe_wna16_marlin_module
    from sglang.kernels.ops.quantization.gptq_marlin_repack import _jit_gptq_marlin_repack_module

    # fused_marlin_moe.py (no expert map): the gate_up GEMM, then the down GEMM with zero_inactive_output=True
    moe = {f"moe_wna16_marlin zero_inactive={z}": functools.partial(
        _jit_moe_wna16_marlin_module, torch.bfloat16, False, False, True, z, True) for z in (False, True)}
    return {**moe, "gptq_marlin bf16": functools.partial(_jit_gptq_marlin_module, torch.bfloat16),
            "gptq_marlin_repack": _jit_gptq_marlin_repack_module}


def timed(name, build):
    t0 = time.time()
    try:
        build()
        print(f"built {name} in {time.time() - t0:.0f}s", flush=True)
    except Exception as e:   # one failed variant must not hide the others' builds
        print(f"FAILED {name} after {time.time() - t0:.0f}s: {type(e).__name__}: {str(e)[:300]}", flush=True)


def main():
    if not os.environ.get("SGLANG_JIT_CACHE_DIR"):
        sys.exit("sglang_jit_prebuild: set SGLANG_JIT_CACHE_DIR (the cache to fill; device_steps.sh packs it)")
    from sglang.kernels.jit.utils.compile.parallel import parallel_compile
    parallel_compile([functools.partial(timed, n, b) for n, b in builders().items()])


if __name__ == "__main__":
    main()
