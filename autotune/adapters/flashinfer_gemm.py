"""FlashInfer's GEMM runner objects, tuning configs and workspaces, private in `flashinfer.gemm.gemm_base`:
what the FP4 and FP8 GEMM families launch a tactic on and key a cache entry with. The public calls
(`mm_fp4`, `bmm_fp8`, `fp4_quantize`) stay in the families; these are the pieces only FlashInfer's own
`fp4_gemm` / `fp8_gemm` ops build, kept here so a release that moves them breaks in one place.
"""
from __future__ import annotations


def _gemm_base():
    from flashinfer.gemm import gemm_base

    return gemm_base


def fp4_runner(backend: str):
    """The runner object FlashInfer's fp4_gemm op builds for `backend` (cudnn, cutlass or b12x) on this GPU."""
    import torch

    g = _gemm_base()
    major, minor = torch.cuda.get_device_capability()
    return {"cudnn": lambda: g._cudnn_gemm_fp4_runner(g._MM_FP4_TUNING_CONFIG_128x4),
            "cutlass": lambda: g.get_cutlass_fp4_gemm_module(major, minor).cutlass_fp4_gemm_runner(),
            "b12x": lambda: g._b12x_gemm_fp4_runner(major, minor, True, torch.bfloat16, True)}[backend]()


def fp4_tuning_config():
    """mm_fp4's tuning config for the 128x4 scale layout SGLang's NVFP4 linear passes."""
    return _gemm_base()._MM_FP4_TUNING_CONFIG_128x4


def fp8_runner(backend: str):
    """The runner object FlashInfer's fp8_gemm op builds for `backend` (cublas or cudnn)."""
    g = _gemm_base()
    return g.get_gemm_module().cublas_fp8_gemm_runner() if backend == "cublas" else g._cudnn_gemm_fp8_runner()


def fp8_tuning_config():
    """bmm_fp8's tuning config (FlashInfer names it for SM100; its op uses it on every GPU)."""
    return _gemm_base()._FP8_GEMM_SM100_TUNING_CONFIG


def workspace_size() -> int:
    return _gemm_base().DEFAULT_WORKSPACE_SIZE


def workspace(name: str, device):
    """FlashInfer's cached workspace buffer `name` on `device`, the one its public call would use."""
    g = _gemm_base()
    return g._get_cache_buf(name, g.DEFAULT_WORKSPACE_SIZE, device)
