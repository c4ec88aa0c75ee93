"""FlashInfer's mm_fp4 on cuDNN, --fp4-gemm-backend flashinfer_cudnn (the hand investigation's
working choice on SM120)."""
from . import MmFp4

RUNNER = MmFp4("fp4_gemm", "cudnn", "flashinfer_cudnn", "flashinfer.mm_fp4(backend='cudnn')", ("mm_fp4", "cudnn"),
               backend="cudnn",
               tunable=True, flashinfer_op="fp4_gemm", flashinfer_runner="CudnnFp4GemmRunner")
