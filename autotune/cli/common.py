"""Shared pieces of the `autotune` command line: the exit codes and the model-selection flags (the
library's error for bad input is autotune.errors.UsageError)."""
from __future__ import annotations

import argparse

from autotune.cli import inputs
from autotune.problems.models import MAX_BATCH

EXIT_NOTHING_DONE = 1
EXIT_BAD_INPUT = 2
EXIT_STORAGE_LOST = 3
EXIT_INCOMPLETE = 4      # files written, but a step failed or a batch size has no key (errors.Incomplete)


def add_selection(p: argparse.ArgumentParser):
    """The "what to tune" flags; returns the group of those that name the models (one of them at
    most: a second was ignored in silence), for a command to add its own way of naming them."""
    g = p.add_argument_group("what to tune")
    models = g.add_mutually_exclusive_group()
    models.add_argument("--shapes", help="a model family preset: qwen3.5 (default) or qwen3-next")
    models.add_argument("--model", help="one preset, e.g. qwen3.5-397b-a17b")
    models.add_argument("--model-config", type=inputs.path, help="any HF config.json of a MoE model (or its folder)")
    g.add_argument("--tp", type=inputs.int_list(), default="1,2,4,8", help="tensor-parallel sizes (list)")
    g.add_argument("--ep", type=inputs.int_list(), default="1", help="expert-parallel sizes (list)")
    g.add_argument("--dtype", type=inputs.dtypes, help="bf16,fp8_w8a8_block,fp8_w8a8 (default: all the GPU supports)")
    g.add_argument("--batch-sizes", type=inputs.int_list(MAX_BATCH),
                   help="token counts M (default: SGLang's 18, 1..4096)")
    g.add_argument("--search-space", type=inputs.path,
                   help="search space YAML (default search_spaces/triton_moe.yaml)")
    return models
