"""FP8 dense GEMM: out[M, N] = x[M, K] @ W[N, K]^T, x bf16 quantized on the fly.

The family: inputs, the float32 reference, the tolerance. One module per backend beside this one
(autotune.contract.runner): SGLang-selectable (block [128, 128] weights, per-token-group
activations) its Triton kernel, DeepGEMM and the sgl_kernel CUTLASS kernel, each through SGLang's
own linear function; for reference only (per-tensor scales, what `torch._scaled_mm` and
FlashInfer's `bmm_fp8` take) cuBLASLt and FlashInfer's cuBLAS / cuDNN backends. The check is
against the float32 product of the unquantized operands: FP8 rounding lands at 2-4%, a broken
kernel at ~100%.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from autotune.adapters import flashinfer_gemm, flashinfer_tuner
from autotune.contract.backend_family import BackendFamily, rotate
from autotune.contract.registry import DENSE
from autotune.contract.runner import Runner, exact_tactic
from autotune.numerics.fp8 import fp8_blocks, fp8_per_matrix

BLOCK = (128, 128)


def sglang_fp8_utils():
    """SGLang's fp8_utils module. Its package's __init__ imports sgl_kernel on CUDA (gguf.py);
    fp8_utils itself does not, so it is imported without that __init__ where the wheel is absent."""
    from autotune.adapters.sglang_loader import sglang_submodule
    return sglang_submodule("sglang.srt.layers.quantization", "fp8_utils")


@dataclass
class GemmInputs:
    problem: object
    M: int
    x: list              # bf16 [M, K] per copy
    w_block: list        # (fp8 [N, K], float32 [N/128, K/128]) per copy
    w_tensor: list       # (fp8 [N, K], float32 scalar) per copy
    w_ref: object        # float32 [N, K] of copy 0
    C: object = None     # last output (poisoned before the checked launch)
    on_cpu: bool = False
    cache: dict = field(default_factory=dict)


def quantize_block(w, block=BLOCK):
    return fp8_blocks(w, block)


def quantize_tensor(w):
    return fp8_per_matrix(w)


class Fp8Gemm(BackendFamily):
    name, problems, dtype, order = "fp8_gemm", DENSE, "fp8_w8a8_block", 20
    flag, sglang_choices, options = "fp8-gemm-backend", "FP8_GEMM_RUNNER_BACKEND_CHOICES", ("skip",)

    def tolerance(self, problem, on_cpu: bool = False) -> float:
        return 0.08

    def footprint(self, problem, device, routings: int = 10):
        """One worker's GPU memory: per batch size its own `routings` weight copies (block and per-tensor
        FP8), the float32 reference weight and activations; two batches' worth kept, and the float32
        weights each copy is generated from."""
        from autotune.gpus.memory_plan import FLUSH_BYTES, Footprint

        p, M = problem, max(problem.batch_sizes)
        held = routings * (2 * p.N * p.K + M * p.K * 2) + p.N * p.K * 4 + M * p.N * (2 + 4)
        return Footprint(f"{self.name} {p.key}", {"inputs": 2 * held,
                                                  "workspace": FLUSH_BYTES + routings * p.N * p.K * 4})

    def make_inputs(self, problem, gemm, M, *, seed=0, skew=0.0, routings=10, on_cpu=False):
        import torch

        dev = "cpu" if on_cpu else "cuda"
        g = torch.Generator(device=dev).manual_seed(seed * 7919 + M)
        N, K = problem.N, problem.K

        def weights(i):
            return torch.randn(N, K, generator=g, device=dev) / K ** 0.5
        ws = rotate(routings, weights)
        x = rotate(routings, lambda i: torch.randn(M, K, generator=g, device=dev).to(torch.bfloat16))
        return GemmInputs(problem, M, x, [quantize_block(w) for w in ws], [quantize_tensor(w) for w in ws],
                          ws[0].float(), on_cpu=on_cpu)

    def reference(self, inputs: GemmInputs, config=None):
        return inputs.x[0].float() @ inputs.w_ref.T


def set_output(inputs: GemmInputs, out):
    inputs.C = out
    return out


FAMILY = Fp8Gemm


def sglang_linear(function: str, inputs: GemmInputs, i: int):
    """One of SGLang's block-FP8 linear functions (what --fp8-gemm-backend selects)."""
    w, s = inputs.w_block[i]
    return set_output(inputs, getattr(sglang_fp8_utils(), function)(inputs.x[i], w, list(BLOCK), s))


def per_tensor_x(x):
    """The activation quantized per tensor, as torch._scaled_mm and bmm_fp8 take it."""
    return quantize_tensor(x.float())


@dataclass(frozen=True)
class SglangLinear(Runner):
    """A backend SGLang's --fp8-gemm-backend selects, run through SGLang's own linear function."""
    function: str = ""

    def run(self, inputs: GemmInputs, routing: int, tactic: int = -1):
        return sglang_linear(self.function, inputs, routing)


@dataclass(frozen=True)
class BmmFp8(Runner):
    """FlashInfer's bmm_fp8 with one of its backends (per-tensor scales). Tactic -1 is the public
    call, as SGLang makes it; other tactics go to the runner object FlashInfer's `fp8_gemm` op
    itself builds for that backend (what its AutoTuner profiles and its cache pins)."""
    backend: str = ""

    def _flashinfer_runner(self, inputs: GemmInputs):
        # one object: cuBLASLt's algo list is cached inside it
        return self.kept(inputs, "runner", lambda: flashinfer_gemm.fp8_runner(self.backend))

    def _operands(self, inputs: GemmInputs, routing: int) -> list:
        """[a, b, scale_a, scale_b, out, workspace]: the inputs list FlashInfer's fp8_gemm passes.
        The activation is quantized per call, as by every per-tensor backend here, so the default
        and the tactics are timed alike."""
        import torch

        a, sa = per_tensor_x(inputs.x[routing])
        w, sw = inputs.w_tensor[routing]
        key = ("out", routing)
        if key not in inputs.cache:
            inputs.cache[key] = (torch.empty((1, inputs.M, inputs.problem.N), dtype=torch.bfloat16, device=a.device),
                                 flashinfer_gemm.workspace("bmm_fp8_workspace", a.device))
        out, ws = inputs.cache[key]
        return [a.unsqueeze(0), w.t().unsqueeze(0), sa, sw, out, ws]

    def tactics(self, inputs: GemmInputs) -> list:
        # Neither runner reads the profile: cuBLASLt's heuristic and cuDNN's plans are for these shapes.
        offered = self._flashinfer_runner(inputs).get_valid_tactics(self._operands(inputs, 0), None)
        if self.backend == "cublas":
            # Algo 0 is the one -1 runs: bmm_fp8's default asks cuBLASLt's heuristic, with the same
            # descriptors and workspace preference, for its first algo. Measured apart it only adds
            # noise to the pin decision (on the H200 it was pinned as "1-3% faster" than itself).
            offered = [t for t in offered if t != 0]
        return [-1] + [flashinfer_tuner.tactic_to_json(t) for t in offered]

    def cache_entries(self, problem, M: int, tactic) -> list:
        """The entry FlashInfer's fp8_gemm would store for bmm_fp8 at M, from the shapes and dtypes
        of the operands `_operands` builds (FlashInfer's own bucketing and key code). None where M is
        not a bucket of its own: a batch between buckets is served by its bucket's entry."""
        import torch

        from autotune.adapters.flashinfer_cache import CacheEntry

        cfg = flashinfer_gemm.fp8_tuning_config()
        if cfg.dynamic_tensor_specs[0].map_to_tuning_buckets(M) != M:
            return []
        N, K = problem.N, problem.K
        shapes = [(1, M, K), (1, K, N), (), (), (1, M, N), (flashinfer_gemm.workspace_size(),)]
        dtypes = (torch.float8_e4m3fn, torch.float8_e4m3fn, torch.bfloat16)   # get_cache_key_extras
        return [CacheEntry.from_call(self.flashinfer_op, self.flashinfer_runner, shapes, cfg,
                                     flashinfer_tuner.json_to_tactic(tactic), dtypes)]

    def run(self, inputs: GemmInputs, routing: int, tactic=-1):
        import flashinfer
        import torch

        ops = self._operands(inputs, routing)
        if tactic == -1:              # the public call, as SGLang makes it
            flashinfer.bmm_fp8(*ops[:4], torch.bfloat16, out=ops[4], backend=self.backend)
        else:
            with exact_tactic(tactic):
                self._flashinfer_runner(inputs)(inputs=ops, tactic=flashinfer_tuner.json_to_tactic(tactic))
        return set_output(inputs, ops[4].squeeze(0))
