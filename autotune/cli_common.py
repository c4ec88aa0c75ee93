"""Shared pieces of the `autotune` command: bad-input errors, exit codes, the model-selection flags,
and what run, worker and export share (progress bars, the --record cache, search settings, the warm
start and the --json summary)."""
from __future__ import annotations

import argparse
import sys

from . import inputs
from .models import MAX_BATCH

EXIT_BAD_INPUT = 2
EXIT_STORAGE_LOST = 3


class UsageError(Exception):
    """Bad input: one line on stderr, exit code 2."""


def add_selection(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("what to tune")
    g.add_argument("--shapes", help="a model family preset: qwen3.5 (default) or qwen3-next")
    g.add_argument("--model", help="one preset, e.g. qwen3.5-397b-a17b")
    g.add_argument("--model-config", type=inputs.path, help="any HF config.json of a MoE model (or its folder)")
    g.add_argument("--tp", type=inputs.int_list(), default="1,2,4,8", help="tensor-parallel sizes (list)")
    g.add_argument("--ep", type=inputs.int_list(), default="1", help="expert-parallel sizes (list)")
    g.add_argument("--dtype", help="bf16,fp8_w8a8_block,fp8_w8a8 (default: all the GPU supports)")
    g.add_argument("--batch-sizes", type=inputs.int_list(MAX_BATCH),
                   help="token counts M (default: SGLang's 18, 1..4096)")
    g.add_argument("--search-space", type=inputs.path,
                   help="search space YAML (default search_spaces/triton_moe.yaml)")


def selection(args):
    """(models, tps, eps, dtypes or None, batch sizes) from the "what to tune" flags."""
    from . import models

    return (models.select_models(args.shapes, args.model, args.model_config),
            models.parse_int_list(args.tp, "--tp"), models.parse_int_list(args.ep, "--ep"),
            tuple(d.strip() for d in args.dtype.split(",")) if args.dtype else None,
            models.parse_int_list(args.batch_sizes, "--batch-sizes", models.MAX_BATCH) if args.batch_sizes
            else models.DEFAULT_BATCH_SIZES)


def problems(args):
    from . import models

    ms, tps, eps, dtypes, bss = selection(args)
    return models.expand(ms, tps, eps, dtypes or models.TRITON_DTYPES, bss)


def print_shared(exp) -> None:
    for key, others in exp.shared.items():
        owner = next(p for p in exp.problems if p.file_key == key)
        for o in others:
            who = ", ".join(sorted({f"{s[0]} tp{s[1]}" for s in o.sources}))
            print(f"note: {who} (K={o.K}, top_k={o.top_k}) maps to the same SGLang file as {owner.key}; "
                  f"that file is tuned for K={owner.K}, top_k={owner.top_k}")


def no_bar(args) -> bool:
    """Progress bars only on a terminal: in a log file they are thousands of carriage returns. The
    one-line summary after each problem is printed either way."""
    return bool(args.quiet) or getattr(args, "log_level", "info") == "warning" or not sys.stderr.isatty()


def triton_settings(args, budget):
    from .study import TuneSettings
    return TuneSettings(trials=args.trials or 40, budget_s=budget, seed=args.seed,
                        neighbours=args.neighbours, use_shipped=not args.no_shipped,
                        warm_start=warm_start(args))


def warm_start(args):
    """--warm-start's source, read once (checked before anything is measured)."""
    if not getattr(args, "warm_start", None):
        return None
    if not hasattr(args, "_warm"):
        from .warm_start import WarmStartError, load
        try:
            args._warm = load(args.warm_start)
        except WarmStartError as e:
            raise UsageError(str(e)) from None
        print(f"warm start: {args._warm.describe()}")
    return args._warm


def summary(args) -> dict:
    """What the run did, for --json (written once at its end)."""
    if not hasattr(args, "_summary"):
        args._summary = {"command": "autotune " + " ".join(sys.argv[1:])}
    return args._summary


def record_measurements(path, device, problem, measurements, careful=()) -> None:
    from .records import Cache, CacheError, read_cache, write_cache

    try:
        cache = read_cache(path)
    except CacheError:
        cache = Cache(device.to_dict())
    cache.problems[problem.key] = problem.to_dict()
    for ms, is_careful in ((measurements, False), (careful, True)):
        for m in ms:
            if m.status != "invalid":
                cache.add(m, careful=is_careful)
    write_cache(path, cache)
