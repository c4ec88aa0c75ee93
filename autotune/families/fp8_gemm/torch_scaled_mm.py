"""torch._scaled_mm (cuBLASLt, per-tensor scales): a reference SGLang cannot select."""
from dataclasses import dataclass

from autotune.contract.capabilities import HOPPER_AND_UP
from autotune.contract.runner import Runner
from autotune.families.fp8_gemm import GemmInputs, per_tensor_x, set_output


@dataclass(frozen=True)
class ScaledMm(Runner):
    def run(self, inputs: GemmInputs, routing: int, tactic: int = -1):
        import torch

        a, sa = per_tensor_x(inputs.x[routing])
        w, sw = inputs.w_tensor[routing]
        return set_output(inputs, torch._scaled_mm(a, w.t(), scale_a=sa, scale_b=sw, out_dtype=torch.bfloat16))


RUNNER = ScaledMm("fp8_gemm", "torch_scaled_mm", None, "torch._scaled_mm (cuBLASLt, per-tensor)",
                  sms=frozenset({89}) | HOPPER_AND_UP)
