"""Number formats computed exactly on the CPU: NVFP4 (e2m1 with e4m3 block scales) as FlashInfer quantizes it."""
