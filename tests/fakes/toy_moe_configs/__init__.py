"""A toy Triton-config family, plugged in as a family installed beside autotune is: this package (its
protocol object, which declares it), named in the entry-point group autotune.families
(tests/contract/test_families.py makes that entry point). It tunes SGLang's fused-MoE config keys over a
space of its own for one expert's GEMMs in plain torch on the CPU: the product is taken in
BLOCK_SIZE_K-wide slices of K and BLOCK_SIZE_M-high slices of the rows, so the config decides the
time as a kernel's tiles would, and every config computes the same numbers. Its files are SGLang's
fused-MoE files, so it takes their rules (coupling, selection, export) from the family that writes them."""
from dataclasses import dataclass

from autotune.contract.config import KernelConfig
from autotune.contract.registry import CONFIGS, MOE
from autotune.families.triton_moe.files import SglangMoeFiles
from autotune.contract.spaces import Space

GEMMS = ("gate_up", "down")
SPACE = {"BLOCK_SIZE_M": (16, 32), "BLOCK_SIZE_N": (64,), "BLOCK_SIZE_K": (16, 256), "GROUP_SIZE_M": (1,),
         "num_warps": (4,), "num_stages": (2,)}
# What this toy's "SGLang" runs untuned: the narrowest K slices, the slow corner of its space.
DEFAULT = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 16, "GROUP_SIZE_M": 1, "num_warps": 4,
           "num_stages": 2}


@dataclass
class ToyInputs:
    x: list
    w: object


class ToyMoeConfigs(SglangMoeFiles):
    name, step, problems, dtype, options = "toy_moe", CONFIGS, MOE, "bf16", ("sglang_versions",)
    gemms = GEMMS

    def __init__(self, sglang_versions: tuple = ()):
        self.sglang_versions = tuple(sglang_versions)

    def unsupported_reason(self, problem, device):
        return None if problem.dtype == "bf16" else f"the toy tunes bf16 experts, not {problem.dtype}"

    def space(self, problem, gemm, device):
        return Space(self.name, dict(SPACE))

    def check(self, config, problem, gemm, device):
        return None if Space(self.name, SPACE).indices_of(config) is not None else "not in the toy's space"

    def unwritable(self, config, gemm, device):
        return None

    def baselines(self, problem, M, device):
        return {"default": {"gate_up": KernelConfig.from_entry(DEFAULT), "down": KernelConfig.from_entry(DEFAULT)}}

    def tolerance(self, problem, on_cpu=False):
        return 1e-4

    def make_inputs(self, problem, gemm, M, *, seed=0, skew=0.0, routings=1, on_cpu=True):
        import torch
        N, K = (problem.N, problem.K) if gemm == "gate_up" else (problem.K, problem.N // 2)
        g = torch.Generator().manual_seed(seed * 7919 + M)
        return ToyInputs([torch.randn(M, K, generator=g) for _ in range(routings)],
                         torch.randn(N, K, generator=g) / K ** 0.5)

    def compile(self, config, inputs):
        pass                                       # plain torch: nothing to build

    def run(self, config, inputs, routing):
        import torch
        x, w, bk, bm = inputs.x[routing], inputs.w, config["BLOCK_SIZE_K"], config["BLOCK_SIZE_M"]
        rows = []
        for xs in x.split(bm, dim=0):
            out = torch.zeros(xs.shape[0], w.shape[0])
            for a, b in zip(xs.split(bk, dim=1), w.split(bk, dim=1)):
                out += a @ b.T
            rows.append(out)
        return torch.cat(rows)

    def reference(self, inputs, config=None):
        return (inputs.x[0].double() @ inputs.w.double().T).float()

    def warmup(self, problems, on_cpu=False):
        pass


FAMILY = ToyMoeConfigs
