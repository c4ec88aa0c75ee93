"""Problems: a model's config read once, presets, and each rank's GEMM shapes with its batch sizes."""
