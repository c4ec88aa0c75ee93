"""FlashInfer's bmm_fp8 on cuBLASLt (per-tensor scales): a reference SGLang cannot select."""
from autotune.families.fp8_gemm import BmmFp8

RUNNER = BmmFp8("fp8_gemm", "flashinfer_cublas", None, "flashinfer.bmm_fp8(backend='cublas') (per-tensor)",
                ("bmm_fp8", "cublas"), backend="cublas",
                tunable=True, flashinfer_op="fp8_gemm", flashinfer_runner="CublasFp8GemmRunner")
