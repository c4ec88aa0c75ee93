"""NVFP4 dense GEMM: flashinfer.mm_fp4(a, b, a_descale, b_descale, alpha, backend=...), one module
per FlashInfer backend beside this one (autotune.kernels.runner); here the inputs and reference.

Operands are quantized once per routing set with FlashInfer's own quantizer (e2m1 values, e4m3
scales per 16 along K in the 128x4 swizzled layout, per-tensor global scale 448 * 6 / amax), as
SGLang's NVFP4 linear layers hold them; b is passed as the column-major (K, N) view of the
(N, K) weight. The reference dequantizes both operands with autotune.nvfp4 and multiplies in
float32, so the tolerance only has to cover accumulation order and the bf16 output.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..backend_family import BackendFamily, rotate
from ..runner import Runner

FP4_MAX, FP8_MAX = 6.0, 448.0


@dataclass
class Fp4Inputs:
    problem: object
    M: int
    a: list          # (packed uint8 [M, K/2], scales, global scale) per routing set
    b: list          # (packed uint8 [N, K/2], scales, global scale) per routing set
    C: object = None
    cache: dict = field(default_factory=dict)


def _global_scale(x):
    return (FP8_MAX * FP4_MAX) / x.float().abs().amax().clamp(min=1e-12)


class Fp4Gemm(BackendFamily):
    name = "fp4_gemm"

    def tolerance(self, problem, on_cpu: bool = False) -> float:
        return 0.02

    def make_inputs(self, problem, gemm, M, *, seed=0, skew=0.0, routings=10, on_cpu=False):
        import torch
        from flashinfer import fp4_quantize

        g = torch.Generator(device="cuda").manual_seed(seed * 7919 + M)

        def quant(rows):
            x = torch.randn(rows, problem.K, generator=g, device="cuda").to(torch.bfloat16)
            gs = _global_scale(x)
            q, sf = fp4_quantize(x, gs)
            return q, sf, gs
        return Fp4Inputs(problem, M, rotate(routings, lambda i: quant(M)), rotate(routings, lambda i: quant(problem.N)))

    def reference(self, inputs: Fp4Inputs, config=None):
        from ... import nvfp4

        (aq, asf, ags), (bq, bsf, bgs) = inputs.a[0], inputs.b[0]
        p = inputs.problem
        return nvfp4.reference_mm(aq, asf, ags, bq, bsf, bgs, inputs.M, p.N, p.K)


@dataclass(frozen=True)
class MmFp4(Runner):
    """flashinfer.mm_fp4 with one of its backends."""
    backend: str = ""

    def run(self, inputs: Fp4Inputs, routing: int, tactic: int = -1):
        import torch
        from flashinfer import mm_fp4

        (aq, asf, ags), (bq, bsf, bgs) = inputs.a[routing], inputs.b[routing]
        alpha = (1.0 / (ags * bgs)).reshape(1).float()
        inputs.C = mm_fp4(aq, bq.T, asf, bsf.T, alpha, torch.bfloat16, backend=self.backend)
        return inputs.C
