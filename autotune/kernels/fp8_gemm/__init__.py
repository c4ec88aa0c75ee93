"""FP8 dense GEMM: out[M, N] = x[M, K] @ W[N, K]^T, x bf16 quantized on the fly.

The family: inputs, the float32 reference, the tolerance. One module per backend beside this one
(autotune.kernels.runner): SGLang-selectable (block [128, 128] weights, per-token-group
activations) its Triton kernel, DeepGEMM and the sgl_kernel CUTLASS kernel, each through SGLang's
own linear function; for reference only (per-tensor scales, what `torch._scaled_mm` and
FlashInfer's `bmm_fp8` take) cuBLASLt and FlashInfer's cuBLAS / cuDNN backends. The check is
against the float32 product of the unquantized operands: FP8 rounding lands at 2-4%, a broken
kernel at ~100%.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..backend_family import BackendFamily, rotate
from ..runner import Runner
from ..triton_moe import fp8_blocks, fp8_per_matrix

BLOCK = (128, 128)


def sglang_fp8_utils():
    """SGLang's fp8_utils module. Its package's __init__ imports sgl_kernel on CUDA (gguf.py);
    fp8_utils itself does not, so it is imported without that __init__ where the wheel is absent."""
    from ..triton_moe import sglang_submodule
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
    name = "fp8_gemm"

    def tolerance(self, problem, on_cpu: bool = False) -> float:
        return 0.08

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
    """FlashInfer's bmm_fp8 with one of its backends (per-tensor scales; reference only)."""
    backend: str = ""

    def run(self, inputs: GemmInputs, routing: int, tactic: int = -1):
        import flashinfer
        import torch

        a, sa = per_tensor_x(inputs.x[routing])
        w, sw = inputs.w_tensor[routing]
        out = flashinfer.bmm_fp8(a.unsqueeze(0), w.t().unsqueeze(0), sa, sw, torch.bfloat16, backend=self.backend)
        return set_output(inputs, out.squeeze(0))
