"""A backend-choice family whose backends misbehave on purpose (tests of the correctness gate).

Backends (the SGLang --moe-runner-backend value each stands in for):
  nan_at_2  (flashinfer_trtllm)  fastest, but NaN at M=2 only
  zeros     (flashinfer_cutedsl) very fast, writes zeros
  crash     (deep_gemm)          kills its process (SIGSEGV)
  hang      (cutlass)            never returns
  good_fast (flashinfer_cutlass) correct, the winner
  good_slow (triton)             correct, slower; what SGLang's auto picks
  missing   (marlin)             never available here (skipped with a reason)
  no_module (triton_kernel)      fastest, but its launch cannot import its module on this machine

A launch costs what SLEEP declares, on the family's own clock (the worker's timing reads it:
autotune.contract.protocol.KernelFamily.clock): which backend is faster is the declaration's, never a loaded
machine's. Only the hang waits for real, until its worker is killed.
"""
import os
import signal
import threading
from types import SimpleNamespace

from autotune.contract.capabilities import Availability
from autotune.contract.runner import Runner
from autotune.contract.spaces import Space

VALUES = {"nan_at_2": "flashinfer_trtllm", "zeros": "flashinfer_cutedsl", "crash": "deep_gemm", "hang": "cutlass",
          "good_fast": "flashinfer_cutlass", "good_slow": "triton", "missing": "marlin",
          "no_module": "triton_kernel"}
SLEEP = {"nan_at_2": 0.0002, "zeros": 0.0002, "good_fast": 0.002, "good_slow": 0.008}


class VirtualClock:
    """Seconds that pass only when a launch says it took them."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FaultyBackends:
    name = "moe_bf16"               # exported as --moe-runner-backend
    spec = "tests.fakes.faulty_backends:FaultyBackends"
    gemms = ("layer",)

    def __init__(self):
        self.clock = VirtualClock()

    def availability(self, device):
        return [Availability(Runner(self.name, b, VALUES[b], "test"), b != "missing",
                             "needs a GPU this test does not have" if b == "missing" else "")
                for b in VALUES]

    def unsupported_reason(self, problem, device):
        return None

    def space(self, problem, gemm, device):
        return Space(self.name, {"backend": tuple(b for b in VALUES if b != "missing"), "tactic": (-1,)})

    def check(self, config, problem, gemm, device):
        return None

    def sglang_auto(self, device):
        return "good_slow"

    def sglang_value(self, backend):
        return VALUES.get(backend)

    def baselines(self, problem, M, device):
        return {}

    def warmup(self, problems, on_cpu=False):
        pass

    def compile(self, config, inputs):
        pass

    def make_inputs(self, problem, gemm, M, *, seed=0, skew=0.0, routings=1, on_cpu=True):
        import torch
        return SimpleNamespace(M=M, C=torch.empty(8), x=torch.arange(8.0) + M)

    def reference(self, inputs, config=None):
        return inputs.x

    def tolerance(self, problem, on_cpu=False):
        return 1e-6

    def run(self, config, inputs, routing):
        b = config["backend"]
        if b == "no_module":
            import sgl_kernel_that_this_machine_lacks  # noqa: F401
        if b == "crash":
            os.kill(os.getpid(), signal.SIGSEGV)
        if b == "hang":
            threading.Event().wait()
        self.clock.advance(SLEEP[b])
        inputs.C.copy_(inputs.x)
        if b == "zeros":
            inputs.C.zero_()
        if b == "nan_at_2" and inputs.M == 2:
            inputs.C[0] = float("nan")
        return inputs.C
