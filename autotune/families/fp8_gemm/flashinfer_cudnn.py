"""FlashInfer's bmm_fp8 on cuDNN (per-tensor scales): a reference SGLang cannot select."""
from autotune.families.fp8_gemm import BmmFp8

RUNNER = BmmFp8("fp8_gemm", "flashinfer_cudnn", None, "flashinfer.bmm_fp8(backend='cudnn') (per-tensor)",
                ("bmm_fp8", "cudnn"), backend="cudnn",
                tunable=True, flashinfer_op="fp8_gemm", flashinfer_runner="CudnnFp8GemmRunner")
