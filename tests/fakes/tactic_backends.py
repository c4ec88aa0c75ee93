"""A backend-choice family with tactics, whose tactics misbehave on purpose (tests of the tactic
gate, the blocklist and the cache; FlashInfer's real runners need a GPU).

Backends: `tunable` (FlashInfer-style runner "FakeFp8GemmRunner" of op "fp8_gemm"; SGLang's auto),
`plain` (no tactics, slow). The tunable runner's tactics:
  -1  its default: correct, slow
   0  correct, the fastest correct one
   1  faster still, but wrong at M=2 only (fine at the other Ms)
   2  "falls back": FlashInfer's cuDNN runners warn and run -1 in its place
   3  correct, slower than 0
   4  offered at M=64 only (a tactic valid at one bucket), correct
`pair` is autotune's own cutlass_fused_moe runner class with a fixed tactic list: [gemm1, gemm2]
profiles, listed one part at a time. gemm1 profile 0 saves 10 ms, 1 saves 5 ms; gemm2 profile 1
saves 10 ms, profile 0 saves 5 ms but is wrong at M=64. Slower than `tunable` everywhere.

A tactic's "kernel time" is what SLEEP declares, on the family's own clock (FaultyBackends'), so
the times that decide a test are the declared ones, whatever else the machine runs.
"""
import warnings
from dataclasses import dataclass

from autotune.contract.capabilities import Availability
from autotune.families.moe_backends.flashinfer_cutlass import CutlassMoe
from autotune.contract.runner import FELL_BACK, Runner, exact_tactic
from autotune.contract.spaces import Space
from tests.fakes.faulty_backends import FaultyBackends

SLEEP = {-1: 0.020, 0: 0.001, 1: 0.0005, 2: 0.0002, 3: 0.008, 4: 0.012}


@dataclass(frozen=True)
class FakeRunner(Runner):
    def tactics(self, inputs):
        return [-1, 0, 1, 2, 3] + ([4] if inputs.M == 64 else [])

    def cache_entries(self, problem, M, tactic):
        from autotune.adapters.flashinfer_cache import CacheEntry
        return [CacheEntry(self.flashinfer_op, self.flashinfer_runner, ((M, problem.K),), tactic)]


@dataclass(frozen=True)
class FakePairRunner(CutlassMoe):
    def tactics(self, inputs):
        return [-1, [0, -1], [1, -1], [-1, 0], [-1, 1]]


def pair_sleep(tactic) -> float:
    if tactic == -1:
        return 0.030
    return 0.030 - {0: 0.010, 1: 0.005}.get(tactic[0], 0) - {1: 0.010, 0: 0.005}.get(tactic[1], 0)


RUNNERS = {"tunable": FakeRunner("moe_bf16", "tunable", "flashinfer_cutlass", "test", tunable=True,
                                 flashinfer_op="fp8_gemm", flashinfer_runner="FakeFp8GemmRunner"),
           "plain": Runner("moe_bf16", "plain", "triton", "test"),
           "pair": FakePairRunner("moe_bf16", "pair", None, "test", tunable=True, tactic_axes=2)}


class TacticBackends(FaultyBackends):
    """FaultyBackends' inputs, reference and stubs; its own backends, with tactics."""
    spec = "tests.fakes.tactic_backends:TacticBackends"

    def runner(self, backend):
        return RUNNERS[backend]

    def availability(self, device):
        return [Availability(r, True, "") for r in RUNNERS.values()]

    def space(self, problem, gemm, device):
        return Space(self.name, {"backend": tuple(RUNNERS), "tactic": (-1,)})

    def sglang_auto(self, device):
        return "tunable"

    def sglang_value(self, backend):
        return RUNNERS[backend].sglang_value

    def tactics(self, config, inputs):
        r = RUNNERS[config["backend"]]
        return r.tactics(inputs) if r.tunable else [-1]

    def run(self, config, inputs, routing):
        tactic = config.get("tactic", -1)
        if config["backend"] == "plain":
            self.clock.advance(0.04)
            return inputs.C.copy_(inputs.x)
        if config["backend"] == "pair":
            self.clock.advance(pair_sleep(tactic))
            inputs.C.copy_(inputs.x)
            if tactic != -1 and tactic[1] == 0 and inputs.M == 64:
                inputs.C[5] -= 2.0
            return inputs.C
        with exact_tactic(tactic):
            if tactic == 2:       # as FlashInfer's cuDNN runner does with a plan that fails
                warnings.warn(f"cuDNN fp8 GEMM tactic failed; {FELL_BACK}. (plan 2 not supported)")
                tactic = -1
            self.clock.advance(SLEEP[tactic])
            inputs.C.copy_(inputs.x)
            if tactic == 1 and inputs.M == 2:
                inputs.C[3] += 1.0
        return inputs.C
