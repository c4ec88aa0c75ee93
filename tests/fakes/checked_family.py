"""A kernel family whose outputs are made to measure, to pin the correctness check (tests of
autotune.measure.timing.check_output through autotune.measure.measurer.Measurer, the path every trial takes).

Its one "kernel" writes the float32 reference with a chosen relative error, or leaves its output
buffer partly or wholly unwritten. The buffer starts out holding the right answer, as it does
after an earlier launch of a correct config on the same inputs: only the NaN poisoning before each
checked launch tells an unwritten output from a right one.

config["writes"]:  all | none (returns the buffer untouched) | half (writes the first half only)
config["error"]:   the relative (Frobenius) error of what it writes, as a multiple of the tolerance
config["rel"]:     that error as a number instead (a tolerance pinned by the test, not read from the family)
config["shape"]:   uniform (ref * (1 + e): every element off by the same share) | spot (one element
                   carries the whole error)
Options: like = a registered family whose tolerance is the one checked against, dtype = the problem
dtype asked of it, as_gpu = ask for its GPU tolerance (Triton's interpreter runs in float32, with a
tighter one).
"""
from types import SimpleNamespace

from autotune.contract.spaces import Space
from tests.fakes.faulty_family import Faulty


class CheckedOutputs(Faulty):
    """Faulty's stubs of the protocol; its own inputs, launch, reference and tolerance."""
    name = "checked"
    spec = "tests.fakes.checked_family:CheckedOutputs"

    def __init__(self, like: str = "triton_moe", dtype: str = "bf16", as_gpu: bool = False):
        from autotune.contract.protocol import get_family

        self.like, self.dtype, self.as_gpu = get_family(like), dtype, as_gpu

    def space(self, problem, gemm, device):
        return Space(self.name, {"writes": ("all",), "error": (0.0,), "shape": ("uniform",)})

    def compile(self, config, inputs):
        pass

    def make_inputs(self, problem, gemm, M, *, seed=0, skew=0.0, routings=1, on_cpu=True):
        import torch

        g = torch.Generator().manual_seed(seed * 7919 + M)
        ref = torch.randn(M, 64, generator=g)
        return SimpleNamespace(problem=problem, M=M, ref=ref, C=ref.clone())

    def reference(self, inputs, config=None):
        return inputs.ref

    def tolerance(self, problem, on_cpu=False):
        return self.like.tolerance(SimpleNamespace(dtype=self.dtype), on_cpu and not self.as_gpu)

    def run(self, config, inputs, routing):
        writes = config.get("writes", "all")
        if writes == "none":
            return inputs.C
        tol = self.tolerance(inputs.problem, on_cpu=True)      # the one the worker checks against
        rel = config["rel"] if "rel" in config else config.get("error", 0.0) * tol
        out = perturbed(inputs.ref, rel, config.get("shape", "uniform"))
        n = out.numel() // 2 if writes == "half" else out.numel()
        inputs.C.view(-1)[:n] = out.view(-1)[:n]
        return inputs.C


def perturbed(ref, rel: float, shape: str = "uniform"):
    """`ref` with a relative Frobenius error of exactly `rel` (to float32 rounding): every element
    scaled by 1 + rel, or the largest one moved by rel x ||ref||."""
    if shape == "uniform":
        return ref * (1 + rel)
    out = ref.clone()
    i = int(ref.abs().argmax())
    out.view(-1)[i] += rel * ref.norm().item() * (1 if ref.view(-1)[i] >= 0 else -1)
    return out
