"""FlashInfer's mm_fp4 on TensorRT-LLM kernels, --fp4-gemm-backend flashinfer_trtllm (SM100)."""
from . import MmFp4

RUNNER = MmFp4("fp4_gemm", "trtllm", "flashinfer_trtllm", "flashinfer.mm_fp4(backend='trtllm')", ("mm_fp4", "trtllm"),
               not_implemented="needs shuffled 8x4 weights", backend="trtllm")
