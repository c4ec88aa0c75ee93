"""A toy backend family, plugged in as a new family is added: this package (the family's protocol
object and one module per backend) and one registry entry (tests/test_families.py). Its backends are
plain torch on the CPU; SGLang's --fp8-gemm-backend is the flag its choice goes to."""
from dataclasses import dataclass, field

from autotune.families.backend_family import BackendFamily
from autotune.families.runner import Runner

@dataclass
class ToyInputs:
    x: object
    w: object
    C: object = None
    cache: dict = field(default_factory=dict)


class ToyGemm(BackendFamily):
    name = "toy_gemm"
    spec = "tests.toy_gemm:ToyGemm"      # how a worker builds it (it is not a built-in family there)

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
