"""NVFP4 dense GEMM, one module per backend beside this one (autotune.contract.runner); here the
inputs and the reference.

Every backend SGLang can select (--fp4-gemm-backend) is launched through SGLang's own NVFP4 linear
layer (autotune.adapters.sglang_layer.Fp4Linear: ModelOpt checkpoint weights through its
weight_loader, its processing into the backend's layout, its forward, which quantizes the bf16
activations with the checkpoint's static input scale). FlashInfer backends SGLang cannot select
(b12x) are launched as FlashInfer's public mm_fp4, on operands quantized by FlashInfer's
fp4_quantize (e2m1 values, e4m3 scales per 16 along K in the 128x4 swizzled layout), b as the
column-major (K, N) view of the (N, K) weight. Their tactics are listed from the runner objects
mm_fp4's `fp4_gemm` op builds, for those same operands.

The reference is x @ W^T in float32 with W the checkpoint's dequantized weight and x unquantized:
W4A4 backends land ~9% from it (the activations' e2m1 rounding), a broken one at ~100%.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from autotune.adapters import flashinfer_gemm, flashinfer_tuner
from autotune.contract.backend_family import BackendFamily
from autotune.contract.registry import DENSE
from autotune.contract.runner import Runner, exact_tactic, flashinfer_pin

INPUT_AMAX = 8.0      # the static activation scale covers |x| <= 8 (unit-normal activations)


@dataclass
class Fp4Inputs:
    problem: object
    M: int
    x: list          # bf16 [M, K] per routing set
    weight: dict     # the checkpoint's NVFP4 weight [N, K]: weight, weight_scale, weight_scale_2, input_scale
    w_ref: object    # float32 [N, K], its dequantization
    layers: dict     # runner name -> its SGLang layer, shared by every M of the problem
    C: object = None
    cache: dict = field(default_factory=dict)


def checkpoint_weight(N: int, K: int, seed: int, device: str = "cuda") -> tuple[dict, object]:
    """A random ModelOpt NVFP4 linear weight [N, K] and its float32 dequantization."""
    import torch

    from autotune.numerics import nvfp4

    g = torch.Generator(device=device).manual_seed(seed * 104729 + 29)
    w = (torch.randn(N, K, generator=g, device=device) / K ** 0.5).to(torch.bfloat16).float()
    gs = nvfp4.global_scale(w)
    q, sf = nvfp4.quantize(w, gs, swizzle=False)
    weight = {"weight": q, "weight_scale": sf, "weight_scale_2": (1.0 / gs).reshape(()).float(),
              "input_scale": torch.tensor(INPUT_AMAX / (448.0 * 6.0), device=device)}
    return weight, nvfp4.dequantize(q, sf, gs, N, K, swizzled=False)


class Fp4Gemm(BackendFamily):
    name, problems, dtype, order = "fp4_gemm", DENSE, "nvfp4", 21
    flag, sglang_choices, options = "fp4-gemm-backend", "FP4_GEMM_RUNNER_BACKEND_CHOICES", ("skip",)

    def __init__(self, skip: tuple = ()):
        super().__init__(skip)
        self._problem, self._weight, self._layers = None, None, {}

    def tolerance(self, problem, on_cpu: bool = False) -> float:
        return 0.3

    def footprint(self, problem, device, routings: int = 10):
        """One worker's GPU memory: the checkpoint's NVFP4 weight and its float32 dequantization, one
        processed copy per backend that runs here (each backend's SGLang layer is kept for every M), two
        of the largest batch's activations, outputs and references."""
        from autotune.gpus.memory_plan import FLUSH_BYTES, Footprint

        p, M = problem, max(problem.batch_sizes)
        nvfp4 = int(p.N * p.K * (0.5 + 1 / 16))
        backends = sum(1 for a in self.availability(device) if a.ok)
        held = routings * M * p.K * 2 + M * p.N * (2 + 4)
        return Footprint(f"{self.name} {p.key}", {"weights": nvfp4 * (1 + backends) + p.N * p.K * 4,
                                                  "inputs": 2 * held, "workspace": FLUSH_BYTES + 3 * p.N * p.K * 4})

    def make_inputs(self, problem, gemm, M, *, seed=0, skew=0.0, routings=10, on_cpu=False):
        import torch

        if self._problem != (problem.key, seed):
            self._weight, self._layers = checkpoint_weight(problem.N, problem.K, seed), {}
            self._problem = (problem.key, seed)
        g = torch.Generator(device="cuda").manual_seed(seed * 7919 + M)
        xs = [torch.randn(M, problem.K, generator=g, device="cuda").to(torch.bfloat16) for _ in range(routings)]
        return Fp4Inputs(problem, M, xs, self._weight[0], self._weight[1], self._layers)

    def reference(self, inputs: Fp4Inputs, config=None):
        return inputs.x[0].float() @ inputs.w_ref.T

    def sglang_auto(self, device) -> str | None:
        from autotune.contract import capabilities as table
        return table.sglang_auto(self.name, device)


FAMILY = Fp4Gemm


@dataclass(frozen=True)
class MmFp4(Runner):
    """flashinfer.mm_fp4 with one of its backends. Tactic -1 is the public call, as SGLang makes
    it; other tactics go to the runner object mm_fp4's `fp4_gemm` op builds for that backend (what
    FlashInfer's AutoTuner profiles and its cache pins)."""
    backend: str = ""

    def _flashinfer_runner(self, inputs: Fp4Inputs):
        return self.kept(inputs, "runner", lambda: flashinfer_gemm.fp4_runner(self.backend))

    def _operands(self, inputs: Fp4Inputs, routing: int) -> list:
        """mm_fp4's choose_one inputs: a, b, a_descale, b_descale, alpha, out_dtype, out,
        block_size, use_nvfp4, workspace (alpha 0-d, as SGLang's ModelOpt linear passes it): the
        activations quantized by FlashInfer's fp4_quantize with the checkpoint's input scale, the
        checkpoint's weight with its scales in the 128x4 layout."""
        import torch
        from flashinfer import fp4_quantize

        from autotune.numerics import nvfp4

        key = ("operands", routing)
        if key not in inputs.cache:
            w = inputs.weight
            ags = 1.0 / w["input_scale"].float()
            aq, asf = fp4_quantize(inputs.x[routing], ags)
            bq, bsf = w["weight"], nvfp4.swizzle_scales(w["weight_scale"]).view(torch.uint8)
            bgs = 1.0 / w["weight_scale_2"]
            alpha = (1.0 / (ags * bgs)).reshape(()).float()
            out = torch.empty((inputs.M, inputs.problem.N), dtype=torch.bfloat16, device=aq.device)
            ws = flashinfer_gemm.workspace("mm_fp4_workspace", aq.device)
            inputs.cache[key] = [aq, bq.T, asf, bsf.T, alpha, torch.bfloat16, out, 16, True, ws]
        return inputs.cache[key]

    def tactics(self, inputs: Fp4Inputs) -> list:
        ops = self._operands(inputs, 0)
        offered = self._flashinfer_runner(inputs).get_valid_tactics(ops, None)
        return [-1] + [flashinfer_tuner.tactic_to_json(t) for t in offered]

    def cache_entries(self, problem, M: int, tactic) -> list:
        """The entry FlashInfer's fp4_gemm would store at M for the operands SGLang's NVFP4 linear
        passes (FlashInfer's own bucketing and key code); none where M is not its own bucket."""
        if flashinfer_gemm.fp4_tuning_config().dynamic_tensor_specs[0].map_to_tuning_buckets(M) != M:
            return []
        return self._entries(problem, M, tactic)

    def _entries(self, problem, M: int, tactic) -> list:
        """The entry for M's bucket (-1 too: a pin of the default)."""
        import torch

        from autotune.adapters.flashinfer_cache import CacheEntry

        cfg = flashinfer_gemm.fp4_tuning_config()
        N, K = problem.N, problem.K

        def meta(*shape, dtype=torch.uint8):
            return torch.empty(shape, dtype=dtype, device="meta")
        ops = [meta(M, K // 2), meta(N, K // 2).T, meta(-(-M // 128) * 128, K // 16), meta(N, K // 16).T,
               meta(dtype=torch.float32), torch.bfloat16, meta(M, N, dtype=torch.bfloat16), 16, True,
               meta(flashinfer_gemm.workspace_size())]
        # The cuDNN runner keys on what picks its graph (its get_cache_key_extras); the others on shapes only.
        extras = (torch.bfloat16, 16, True, True) if self.backend == "cudnn" else ()
        return [CacheEntry.from_call(self.flashinfer_op, self.flashinfer_runner,
                                     flashinfer_tuner.input_sizes(ops), cfg, flashinfer_tuner.json_to_tactic(tactic),
                                     extras)]

    def run(self, inputs: Fp4Inputs, routing: int, tactic=-1):
        import torch
        from flashinfer import mm_fp4

        ops = self._operands(inputs, routing)
        if tactic == -1:              # the public call, as SGLang makes it
            mm_fp4(*ops[:5], torch.bfloat16, out=ops[6], backend=self.backend)
        else:
            with exact_tactic(tactic):
                self._flashinfer_runner(inputs)(inputs=ops, tactic=flashinfer_tuner.json_to_tactic(tactic))
        inputs.C = ops[6]
        return inputs.C


@dataclass(frozen=True)
class SglangFp4Linear(MmFp4):
    """A --fp4-gemm-backend value, launched through SGLang's NVFP4 linear layer (built on the first
    launch of a problem, with SGLang's refusals raised there, and kept for its other Ms). A tactic
    is pinned through FlashInfer's cache, as the server reads the tuned folder's."""

    def layer(self, inputs: Fp4Inputs):
        from autotune.adapters.sglang_layer import Fp4Linear, refusals

        if self.name not in inputs.layers:
            with refusals(f"SGLang's {self.sglang_value} FP4 GEMM"):
                inputs.layers[self.name] = Fp4Linear(inputs.problem.N, inputs.problem.K, self.sglang_value).load(
                    dict(inputs.weight))
        return inputs.layers[self.name]

    def run(self, inputs: Fp4Inputs, routing: int, tactic=-1):
        import contextlib

        from autotune.adapters.sglang_layer import refusals

        layer = self.layer(inputs)
        pin = (flashinfer_pin(self._entries(inputs.problem, inputs.M, tactic), [tactic]) if self.tunable
               else contextlib.nullcontext())
        with refusals(f"SGLang's {self.sglang_value} FP4 GEMM"), pin:
            inputs.C = layer(inputs.x[routing])
        return inputs.C
