"""FlashInfer's mm_fp4 on cuDNN through SGLang's NVFP4 linear, --fp4-gemm-backend flashinfer_cudnn (the
hand investigation's working choice on SM120); its tactics are cuDNN's plans."""
from autotune.families.fp4_gemm import SglangFp4Linear

RUNNER = SglangFp4Linear("fp4_gemm", "cudnn", "flashinfer_cudnn", "flashinfer.mm_fp4(backend='cudnn')",
                         ("mm_fp4", "cudnn"), backend="cudnn", tunable=True,
                         flashinfer_op="fp4_gemm", flashinfer_runner="CudnnFp4GemmRunner")
