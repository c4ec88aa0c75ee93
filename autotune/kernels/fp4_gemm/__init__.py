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
from ..runner import Runner, exact_tactic

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
    """flashinfer.mm_fp4 with one of its backends. Tactic -1 is the public call, as SGLang makes
    it; other tactics go to the runner object mm_fp4's `fp4_gemm` op builds for that backend (what
    FlashInfer's AutoTuner profiles and its cache pins)."""
    backend: str = ""

    def _flashinfer_runner(self, inputs: Fp4Inputs):
        import torch
        from flashinfer.gemm import gemm_base as g

        def make():
            major, minor = torch.cuda.get_device_capability()
            return {"cudnn": lambda: g._cudnn_gemm_fp4_runner(g._MM_FP4_TUNING_CONFIG_128x4),
                    "cutlass": lambda: g.get_cutlass_fp4_gemm_module(major, minor).cutlass_fp4_gemm_runner(),
                    "b12x": lambda: g._b12x_gemm_fp4_runner(major, minor, True, torch.bfloat16, True)}[self.backend]()
        return self.kept(inputs, "runner", make)

    def _operands(self, inputs: Fp4Inputs, routing: int) -> list:
        """mm_fp4's choose_one inputs: a, b, a_descale, b_descale, alpha, out_dtype, out,
        block_size, use_nvfp4, workspace (alpha 0-d, as SGLang's ModelOpt linear passes it)."""
        import torch
        from flashinfer.gemm import gemm_base as g

        key = ("operands", routing)
        if key not in inputs.cache:
            (aq, asf, ags), (bq, bsf, bgs) = inputs.a[routing], inputs.b[routing]
            alpha = (1.0 / (ags * bgs)).reshape(()).float()
            out = torch.empty((inputs.M, inputs.problem.N), dtype=torch.bfloat16, device=aq.device)
            ws = g._get_cache_buf("mm_fp4_workspace", g.DEFAULT_WORKSPACE_SIZE, aq.device)
            inputs.cache[key] = [aq, bq.T, asf, bsf.T, alpha, torch.bfloat16, out, 16, True, ws]
        return inputs.cache[key]

    def tactics(self, inputs: Fp4Inputs) -> list:
        from flashinfer.autotuner import _tactic_to_json

        ops = self._operands(inputs, 0)
        offered = self._flashinfer_runner(inputs).get_valid_tactics(ops, None)
        return [-1] + [_tactic_to_json(t) for t in offered]

    def cache_entries(self, problem, M: int, tactic) -> list:
        """The entry FlashInfer's fp4_gemm would store at M for the operands SGLang's NVFP4 linear
        passes (FlashInfer's own bucketing and key code); none where M is not its own bucket."""
        import torch
        from flashinfer.autotuner import AutoTuner, _json_to_tactic
        from flashinfer.gemm import gemm_base as g

        from ...export.flashinfer import CacheEntry

        cfg = g._MM_FP4_TUNING_CONFIG_128x4
        if cfg.dynamic_tensor_specs[0].map_to_tuning_buckets(M) != M:
            return []
        N, K = problem.N, problem.K

        def meta(*shape, dtype=torch.uint8):
            return torch.empty(shape, dtype=dtype, device="meta")
        ops = [meta(M, K // 2), meta(N, K // 2).T, meta(-(-M // 128) * 128, K // 16), meta(N, K // 16).T,
               meta(dtype=torch.float32), torch.bfloat16, meta(M, N, dtype=torch.bfloat16), 16, True,
               meta(g.DEFAULT_WORKSPACE_SIZE)]
        # The cuDNN runner keys on what picks its graph (its get_cache_key_extras); the others on shapes only.
        extras = (torch.bfloat16, 16, True, True) if self.backend == "cudnn" else ()
        return [CacheEntry.from_call(self.flashinfer_op, self.flashinfer_runner,
                                     AutoTuner.get()._get_input_sizes(ops), cfg, _json_to_tactic(tactic), extras)]

    def run(self, inputs: Fp4Inputs, routing: int, tactic=-1):
        import torch
        from flashinfer import mm_fp4

        from flashinfer.autotuner import _json_to_tactic

        ops = self._operands(inputs, routing)
        if tactic == -1:              # the public call, as SGLang makes it
            mm_fp4(*ops[:5], torch.bfloat16, out=ops[6], backend=self.backend)
        else:
            with exact_tactic(tactic):
                self._flashinfer_runner(inputs)(inputs=ops, tactic=_json_to_tactic(tactic))
        inputs.C = ops[6]
        return inputs.C
