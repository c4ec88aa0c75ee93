"""SGLang's Marlin FP4 GEMM through its NVFP4 linear, --fp4-gemm-backend marlin: weight-only (W4A16),
SGLang's auto on SM80-SM99, where no FP4 tensor cores exist."""
from autotune.families.fp4_gemm import SglangFp4Linear

RUNNER = SglangFp4Linear("fp4_gemm", "marlin", "marlin", "SGLang's NVFP4 linear, marlin (W4A16)",
                         sms=frozenset({80, 86, 89, 90, 100, 103, 110, 120, 121}), backend="marlin")
