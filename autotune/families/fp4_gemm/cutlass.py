"""FlashInfer's mm_fp4 on CUTLASS through SGLang's NVFP4 linear, --fp4-gemm-backend flashinfer_cutlass
(SGLang's auto on SM120); its tactics are the CUTLASS tile/schedule configs of FlashInfer's runner."""
from autotune.families.fp4_gemm import SglangFp4Linear

RUNNER = SglangFp4Linear("fp4_gemm", "cutlass", "flashinfer_cutlass", "flashinfer.mm_fp4(backend='cutlass')",
                         ("mm_fp4", "cutlass"), tunable=True, backend="cutlass",
                         flashinfer_op="fp4_gemm", flashinfer_runner="CutlassFp4GemmRunner")
