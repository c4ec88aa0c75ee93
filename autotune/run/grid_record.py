"""`autotune record`: a whole grid measured into a measurement cache (what a replay answers from)."""
from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from autotune.errors import UsageError
from autotune.contract import registry
from autotune.run.step import Step

if TYPE_CHECKING:
    from autotune.measure.records import Cache


@dataclass
class RecordGrid(Step):
    """Every config of the search space (this --shard of it) and SGLang's baselines at every M of the
    problems, measured into --cache (extended: what it holds is not measured again). Its check: --cache
    is a measurement cache or absent, read before any worker starts."""
    needs = ("request", "device", "sinks", "plans", "pool")
    cache_path: str
    shard: tuple | None = None
    old: Cache | None = None       # what --cache holds, read by the check

    def check(self, ctx) -> None:
        from autotune.measure.records import CacheError, read_cache

        try:
            self.old = read_cache(self.cache_path) if Path(self.cache_path).exists() else None
        except CacheError as e:
            raise UsageError(f"--cache {e}; refusing to overwrite it (name a new file)") from None

    def run(self, ctx) -> None:
        record_grid(ctx, self.cache_path, self.old, self.shard)


def record_grid(ctx, path: str, old, shard) -> None:
    from autotune.contract.protocol import get_family
    from autotune.measure.records import Cache, write_cache
    from autotune.measure.tasks import run_tasks

    req, device, pool, plans = ctx.request, ctx.device, ctx.pool, ctx.plans
    budget = req.budget
    family = get_family(registry.default(), space_path=req.search_space)
    cache = old or Cache(device.to_dict())
    cache.device = device.to_dict()
    cache.notes["compile_workers"] = len(pool.slots)
    for p, why in plans[0].skipped:
        print(f"skip {p.key}: {why}")
    tasks = grid_tasks(family, plans[0].problems, device, cache, shard or (0, 1), req.seed)
    print(f"record: {len(tasks)} configs to measure on {device.name} with {len(pool.slots)} workers"
          + (f", budget {budget:.0f} s" if budget else ""))
    t0 = time.monotonic()
    last_write = [t0]
    with ctx.sinks.progress.bar(len(tasks), "config") as bar:
        def landed(task, ms):
            for m in ms:
                cache.add(m)
            bar.update(1)
            if time.monotonic() - last_write[0] > 60:   # a killed call keeps what it measured
                write_cache(path, cache)
                last_write[0] = time.monotonic()
        queue = run_tasks(pool, tasks, landed, stop=lambda: budget is not None and time.monotonic() - t0 > budget)
    write_cache(path, cache)
    n_ok = sum(1 for m in cache.records.values() if m.ok)
    print(f"record: {len(cache.records)} measurements ({n_ok} ok) in {path}; "
          f"{len(queue)} configs left for a later call; {time.monotonic() - t0:.0f} s")


def grid_tasks(family, problems, device, cache, shard: tuple, seed: int) -> list:
    """One task per config (this shard of each GEMM's runnable grid, and SGLang's baselines) with the
    batch sizes `cache` lacks of it (each problem noted in `cache`); baselines first, the rest in a seeded
    random order."""
    from autotune.measure.tasks import Task

    index, nshard = shard
    tasks, base_configs = [], []
    for p in problems:
        cache.problems[p.key] = p.to_dict()
        configs = {g: [] for g in family.gemms}
        for M in p.batch_sizes:
            for pair in family.baselines(p, M, device).values():
                for g, c in pair.items():
                    if c not in configs[g]:
                        configs[g].append(c)
                        base_configs.append(c)
        for g in family.gemms:
            grid = [c for c in family.space(p, g, device).configs() if family.check(c, p, g, device) is None]
            configs[g] += [c for i, c in enumerate(grid) if i % nshard == index and c not in configs[g]]
            for c in configs[g]:
                Ms = [M for M in p.batch_sizes if cache.get(p.key, g, M, c) is None]
                if Ms:
                    tasks.append(Task(p.to_dict(), p.key, g, c, Ms))
    # Random order: a recording cut short by --budget is a uniform sample of the grid, and a
    # later call (same --cache) measures the rest. Baselines go first.
    tasks.sort(key=lambda t: 0 if any(t.config == b for b in base_configs) else 1)
    n_base = sum(1 for t in tasks if any(t.config == b for b in base_configs))
    rest = tasks[n_base:]
    random.Random(seed).shuffle(rest)
    return tasks[:n_base] + rest
