"""How close does the search get to the grid optimum, with how few measurements? (replay)

For each seed, the whole pipeline (baselines, search, top-3 re-measurement, selection) runs
against the recorded full grid (tests/data/h200_triton_moe_bf16_grid.jsonl.gz), limited to
10% of the grid's measurements. Per M, the gap is the grid time of the selected
(gate_up, down) pair over the grid's best pair sharing BLOCK_SIZE_M. Runs twice per seed:
as the tool runs (seeded with SGLang's shipped H200 config) and without the shipped seed.

usage: python benchmarks/search_efficiency.py [--seeds 20] [--fraction 0.1] [--jobs 2]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_to_grid import grid_optimum, replayed_tuner  # noqa: E402  (one definition of the metric)


def one(args):
    seed, shipped, fraction = args
    from autotune.families.triton_moe.pairs import select_problem
    from autotune.search.study import TuneSettings

    t0 = time.time()
    settings = TuneSettings(trials=1000, seed=seed, use_shipped=shipped)
    tuner, pool, cache, pk = replayed_tuner(settings)
    problem = tuner.problem
    grid_evals = sum(1 for m in cache.records.values() if m.problem == pk)
    limit = int(fraction * grid_evals)
    settings.max_evaluations = limit - 8 * len(problem.batch_sizes) * 2
    tuner.measure_baselines()
    tuner.search()
    choices = select_problem(tuner, settings.top, settings.careful_repeats)
    gaps = {}
    for M in problem.batch_sizes:
        c = choices[M]
        g, d = cache.get(pk, "gate_up", M, c.gate_up), cache.get(pk, "down", M, c.down)
        gaps[M] = (g.time_us + d.time_us) / grid_optimum(cache, pk, M) - 1
    return {"seed": seed, "shipped": shipped, "answered": pool.answered, "limit": limit, "grid": grid_evals,
            "device_s": pool.charged_s, "gaps": gaps, "wall_s": time.time() - t0}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--fraction", type=float, default=0.1)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/search_efficiency.json"))
    a = ap.parse_args()
    jobs = [(s, shipped, a.fraction) for shipped in (True, False) for s in range(a.seeds)]
    with mp.get_context("spawn").Pool(a.jobs) as pool:
        results = pool.map(one, jobs)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(results, indent=1))
    for shipped in (True, False):
        rs = [r for r in results if r["shipped"] == shipped]
        Ms = sorted(rs[0]["gaps"], key=int)
        print(f"\n{'with' if shipped else 'without'} SGLang's shipped config as a seed: {len(rs)} seeds, "
              f"measurements {statistics.median(r['answered'] for r in rs):.0f} of a {rs[0]['grid']}-measurement grid "
              f"(limit {rs[0]['limit']}), replayed device time {statistics.median(r['device_s'] for r in rs):.0f} s")
        print("   M | median gap | worst seed | seeds within 2%")
        for M in Ms:
            g = [r["gaps"][M] for r in rs]
            print(f"{M:>4} | {statistics.median(g):+10.2%} | {max(g):+10.2%} | {sum(x <= 0.02 for x in g):>3}/{len(g)}")
        worst = [max(r["gaps"].values()) for r in rs]
        print(f"worst M per seed: median {statistics.median(worst):+.2%}; "
              f"mean gap over M, median over seeds {statistics.median(statistics.mean(r['gaps'].values()) for r in rs):+.2%}")


if __name__ == "__main__":
    sys.exit(main())
