"""What autotune knows of GPUs: the catalog of models, the device a run measures on, and the GPU memory plan."""
