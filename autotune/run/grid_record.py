"""`autotune record`: a whole grid measured into a measurement cache (what a replay answers from)."""
from __future__ import annotations

import random
import sys
import time
from pathlib import Path

from autotune.errors import UsageError
from autotune.run.common import no_bar
from autotune.run.opening import open_device


def record_grid(req) -> None:
    """Every config of the search space (this --shard of it) and SGLang's baselines at every M of
    the problems, measured into --cache (extended: what it holds is not measured again)."""
    from tqdm import tqdm

    from autotune.families import registry
    from autotune.families.protocol import get_family
    from autotune.measure.records import Cache, CacheError, read_cache, write_cache
    from autotune.measure.tasks import Task, run_tasks

    budget = req.budget
    if req.replay:
        raise UsageError("record measures on a GPU; --replay makes no sense here")
    try:                     # the cache it extends is read before any worker starts
        old = read_cache(req.cache) if Path(req.cache).exists() else None
    except CacheError as e:
        raise UsageError(f"--cache {e}; refusing to overwrite it (name a new file)") from None
    device, pool, _, _, plans, _ = open_device(req)
    family = get_family(registry.default(), space_path=req.search_space)
    cache = old or Cache(device.to_dict())
    cache.device = device.to_dict()
    cache.notes["compile_workers"] = len(pool.slots)
    shard, nshard = req.shard or (0, 1)
    problems = plans[0].problems
    with pool:
        for p, why in plans[0].skipped:
            print(f"skip {p.key}: {why}")
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
                configs[g] += [c for i, c in enumerate(grid) if i % nshard == shard and c not in configs[g]]
                for c in configs[g]:
                    Ms = [M for M in p.batch_sizes if cache.get(p.key, g, M, c) is None]
                    if Ms:
                        tasks.append(Task(p.to_dict(), p.key, g, c, Ms))
        # Random order: a recording cut short by --budget is a uniform sample of the grid, and a
        # later call (same --cache) measures the rest. Baselines go first.
        tasks.sort(key=lambda t: 0 if any(t.config == b for b in base_configs) else 1)
        n_base = sum(1 for t in tasks if any(t.config == b for b in base_configs))
        rest = tasks[n_base:]
        random.Random(req.seed).shuffle(rest)
        tasks = tasks[:n_base] + rest
        print(f"record: {len(tasks)} configs to measure on {device.name} with {len(pool.slots)} workers"
              + (f", budget {budget:.0f} s" if budget else ""))
        t0 = time.monotonic()
        last_write = [t0]
        with tqdm(total=len(tasks), unit="config", file=sys.stderr, disable=no_bar(req), dynamic_ncols=True) as bar:
            def landed(task, ms):
                for m in ms:
                    cache.add(m)
                bar.update(1)
                if time.monotonic() - last_write[0] > 60:   # a killed call keeps what it measured
                    write_cache(req.cache, cache)
                    last_write[0] = time.monotonic()
            queue = run_tasks(pool, tasks, landed,
                              stop=lambda: budget is not None and time.monotonic() - t0 > budget)
    write_cache(req.cache, cache)
    n_ok = sum(1 for m in cache.records.values() if m.ok)
    print(f"record: {len(cache.records)} measurements ({n_ok} ok) in {req.cache}; "
          f"{len(queue)} configs left for a later call; {time.monotonic() - t0:.0f} s")
