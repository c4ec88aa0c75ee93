"""A toy backend family, plugged in as a family installed beside autotune is: this package (the family's
protocol object, which declares it, and one module per backend), named in the entry-point group
autotune.families (tests/contract/test_families.py makes that entry point). Its backends are plain torch on the
CPU; SGLang's --fp8-gemm-backend is the flag its choice goes to."""
from dataclasses import dataclass, field

from autotune.contract.backend_family import BackendFamily
from autotune.contract.registry import DENSE
from autotune.contract.runner import Runner


@dataclass
class ToyInputs:
    x: object
    w: object
    C: object = None
    cache: dict = field(default_factory=dict)


class ToyGemm(BackendFamily):
    name, problems, dtype = "toy_gemm", DENSE, "fp8_w8a8_block"
    flag, sglang_choices, options = "fp8-gemm-backend", "FP8_GEMM_RUNNER_BACKEND_CHOICES", ("skip",)

    def unsupported_reason(self, problem, device):
        return None                      # plain torch: runs on the CPU too

    def sglang_auto(self, device):
        return "plain"                   # what SGLang's `auto` would pick, for this toy

    def tolerance(self, problem, on_cpu=False):
        return 1e-3

    def make_inputs(self, problem, gemm, M, *, seed=0, skew=0.0, routings=1, on_cpu=True):
        import torch
        g = torch.Generator().manual_seed(seed * 7919 + M)
        return ToyInputs([torch.randn(M, problem.K, generator=g) for _ in range(routings)],
                         torch.randn(problem.N, problem.K, generator=g) / problem.K ** 0.5)

    def reference(self, inputs, config=None):
        return inputs.x[0].double() @ inputs.w.double().T


FAMILY = ToyGemm


@dataclass(frozen=True)
class ToyRunner(Runner):
    chunks: int = 1                      # K split into this many partial products
    wrong: bool = False                  # a backend that computes the wrong thing

    def run(self, inputs, routing, tactic=-1):
        x, w = inputs.x[routing], inputs.w
        parts = zip(x.chunk(self.chunks, dim=1), w.chunk(self.chunks, dim=1))
        out = sum(a @ b.T for a, b in parts)
        inputs.C = out.double() * (2.0 if self.wrong else 1.0)
        return inputs.C
