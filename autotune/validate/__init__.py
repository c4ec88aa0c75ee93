"""`autotune validate`: tuned configs checked end to end before they are published.

Two engines measure decode throughput, default vs tuned, interleaved and repeated:

- `sglang_server`: the real path. SGLang's own server (`python -m sglang.launch_server`) started
  twice per repeat, with SGLang's defaults and with the tuned files, measured by SGLang's own
  benchmark modules (`sglang.benchmark.serving`, `sglang.benchmark.one_batch_server`).
- `harness`: for GPUs where the server cannot run. A decode step built from the model's per-layer
  shapes with random weights, its fused MoE through the same runner code as tuning. A harness,
  not a model.

`gate` tells a gain from noise and fails on regressions; `report` writes validation.json, the plot
and report.md; `command` is the CLI sub-command.
"""
from __future__ import annotations


class ValidateError(ValueError):
    """Bad input or a failed run: one clear message, exit code 2 (no server is left running)."""


class ModelDirError(ValidateError):
    """The model folder cannot be served (missing, no config.json, no tokenizer)."""


class ConfigDirError(ValidateError):
    """The tuned-configs folder holds nothing SGLang would load."""


class PortInUseError(ValidateError):
    """The port asked for is taken."""


class ServerError(ValidateError):
    """The server exited or never became healthy."""


class BenchmarkError(ValidateError):
    """A benchmark exited non-zero, timed out, or wrote no result."""


class CommandError(ValidateError):
    """A command line we built is refused by SGLang's own argument parser."""


class HarnessError(ValidateError):
    """The decode harness cannot run as asked (no GPU, no tuned file, wrong results)."""
