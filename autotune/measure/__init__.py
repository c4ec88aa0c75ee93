"""Measuring: tasks, the worker pool and each worker's measurer, CUDA-graph timing and the numerics check, the
replay of recorded measurements, and the measurement records."""
