"""Number formats computed exactly on the CPU: FP8 with block or per-matrix scales, and NVFP4 (e2m1 with
e4m3 block scales) as FlashInfer quantizes it."""
