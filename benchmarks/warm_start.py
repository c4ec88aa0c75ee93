"""Device time to come within 2% of the grid optimum, with and without a warm start (replay).

The bf16 E=512 N=128 K=4096 study runs against the recorded H200 grid
(tests/data/h200_triton_moe_bf16_grid.jsonl.gz) as `autotune run` runs it (SGLang's default and
shipped configs as baselines and seeds), cold or warm-started from the H200 block-FP8 run of the
same shape (benchmarks/data/h200_run_fp8_block_2026-12-01.jsonl.gz: another dtype, whose best
tiles are the prior). Same seeds, same trial budget. Per M: the replayed device seconds (compile
shared by 15 parallel compilers + timing, as the replay charges) until the best (gate_up, down)
pair sharing BLOCK_SIZE_M measured so far is within 2% of the grid's best pair; "never" when the
budget ends first. A replay of real measurements, not a GPU run: labelled as such in the output.

usage: python benchmarks/warm_start.py [--seeds 10] [--trials 40] [--jobs 2]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "benchmarks/data/h200_run_fp8_block_2026-12-01.jsonl.gz"
sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_to_grid import grid_optimum, replayed_tuner  # noqa: E402  (one definition of the metric)


def one(args):
    seed, warm, trials = args
    from autotune.measure.replay import ReplayPool
    from autotune.families.triton_moe.pairs import candidate_pairs
    from autotune.search.study import TuneSettings
    from autotune.families.triton_moe import TritonMoe
    from autotune.search.warm_start import load

    log = []                                   # (device seconds so far, measurement) in answer order

    class Logged(ReplayPool):
        def submit(self, task):
            super().submit(task)
            for m in self._done[-1][2]:
                log.append((self.charged_s, m))
    settings = TuneSettings(trials=trials, seed=seed, warm_start=load(str(SOURCE), TritonMoe) if warm else None)
    tuner, pool, cache, pk = replayed_tuner(settings, Logged)
    problem = tuner.problem
    tuner.measure_baselines()
    tuner.search()
    reached = {}
    for M in problem.batch_sizes:
        target = grid_optimum(cache, pk, M) * 1.02
        seen = {"gate_up": [], "down": []}
        reached[M] = None
        for t, m in log:
            if m.M != M or not m.ok:
                continue
            seen[m.gemm].append(m)
            best = candidate_pairs(seen["gate_up"], seen["down"], top=1)
            if best and best[0][2] <= target:
                reached[M] = t
                break
    return {"seed": seed, "warm": warm, "reached_s": reached, "device_s": pool.charged_s,
            "warm_configs": tuner.warm_queued}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--trials", type=int, default=40)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/warm_start.json"))
    a = ap.parse_args()
    jobs = [(s, warm, a.trials) for warm in (False, True) for s in range(a.seeds)]
    with mp.get_context("spawn").Pool(a.jobs) as pool:
        results = pool.map(one, jobs)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(results, indent=1))
    print(f"REPLAY of the recorded H200 bf16 grid; {a.seeds} seeds, {a.trials} trials per study; "
          f"warm start from {SOURCE.name}")
    Ms = sorted(results[0]["reached_s"], key=int)
    print("   M | cold: median s to 2% (never) | warm: median s to 2% (never)")
    for M in Ms:
        cells = []
        for warm in (False, True):
            xs = [r["reached_s"][M] for r in results if r["warm"] == warm]
            hit = [x for x in xs if x is not None]
            cells.append(f"{statistics.median(hit):7.1f} ({len(xs) - len(hit)})" if hit else f"  never ({len(xs)})")
        print(f"{M:>4} | {cells[0]:>29} | {cells[1]:>29}")
    for warm in (False, True):
        rs = [r for r in results if r["warm"] == warm]
        alls = [max(r["reached_s"].values()) if all(v is not None for v in r["reached_s"].values()) else None
                for r in rs]
        hit = [x for x in alls if x is not None]
        print(f"{'warm' if warm else 'cold'}: every M within 2% after a median {statistics.median(hit):.1f} s "
              f"({len(rs) - len(hit)} seeds never); whole search {statistics.median(r['device_s'] for r in rs):.1f} s"
              if hit else f"{'warm' if warm else 'cold'}: no seed reached 2% at every M")


if __name__ == "__main__":
    sys.exit(main())
