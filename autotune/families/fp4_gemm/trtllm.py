"""FlashInfer's mm_fp4 on TensorRT-LLM kernels through SGLang's NVFP4 linear, --fp4-gemm-backend
flashinfer_trtllm (SM100; SGLang's processing makes its shuffled weights)."""
from autotune.families.fp4_gemm import SglangFp4Linear

RUNNER = SglangFp4Linear("fp4_gemm", "trtllm", "flashinfer_trtllm", "flashinfer.mm_fp4(backend='trtllm')",
                         ("mm_fp4", "trtllm"), backend="trtllm")
