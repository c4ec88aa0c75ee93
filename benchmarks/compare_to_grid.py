"""Judge a tuned folder against a recorded full grid: per recorded M, the grid time of the pair
SGLang loads from the folder over the grid's best pair sharing BLOCK_SIZE_M (what SGLang can run),
and the grid times of SGLang's default and shipped pairs.

The pair is read through SGLang's own loader (SGLANG_MOE_CONFIG_DIR = the folder), so the check
covers file names and the nearest-M lookup too. Exit 1 when a gap exceeds --max-gap.

usage: python benchmarks/compare_to_grid.py --configs tuned_configs/NVIDIA_H200
          [--grid tests/data/h200_triton_moe_bf16_grid.jsonl.gz] [--max-gap 0.03] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GRID = ROOT / "tests/data/h200_triton_moe_bf16_grid.jsonl.gz"


def replayed_tuner(settings, pool_class=None):
    """(tuner, pool, cache, problem key) of the whole pipeline against the recorded grid, in
    memory: the stand-in for the GPU that the replay benchmarks share."""
    import optuna

    from autotune.contract.protocol import get_family
    from autotune.problems.models import Problem
    from autotune.measure.records import read_cache
    from autotune.measure.replay import ReplayPool
    from autotune.search.context import SearchContext
    from autotune.search.study import ProblemTuner

    cache = read_cache(GRID)
    (pk, pd), = cache.problems.items()
    pool = (pool_class or ReplayPool)(cache)
    tuner = ProblemTuner(SearchContext(optuna.storages.InMemoryStorage(), pool.device, pool, settings),
                         Problem.from_dict(pd), get_family("triton_moe"))
    return tuner, pool, cache, pk


def grid_best_pair(cache, pk: str, M: int):
    """The grid's fastest (gate_up, down) measurements that share BLOCK_SIZE_M."""
    best: dict = {}
    for m in cache.records.values():
        if m.problem == pk and m.M == M and m.ok:
            key = (m.gemm, m.config["BLOCK_SIZE_M"])
            if key not in best or m.time_us < best[key].time_us:
                best[key] = m
    bms = {bm for g, bm in best if g == "gate_up"} & {bm for g, bm in best if g == "down"}
    bm = min(bms, key=lambda bm: best["gate_up", bm].time_us + best["down", bm].time_us)
    return best["gate_up", bm], best["down", bm]


def grid_optimum(cache, pk: str, M: int) -> float:
    up, down = grid_best_pair(cache, pk, M)
    return up.time_us + down.time_us


def pair_us(cache, pk: str, M: int, up: dict, down: dict) -> float | None:
    """Grid time of a pair (entries of SGLang's files); None when the grid lacks either config (or it failed there)."""
    from autotune.contract.config import KernelConfig

    g, d = (cache.get(pk, gemm, M, KernelConfig.from_entry(c)) for gemm, c in (("gate_up", up), ("down", down)))
    if g is None or d is None or not (g.ok and d.ok):
        return None
    return g.time_us + d.time_us


def compare(configs: str | Path, grid: str | Path = GRID) -> list[dict]:
    from autotune.gpus.device import DeviceInfo
    from autotune.adapters.sglang_loader import sglang_selection
    from autotune.families.triton_moe import TritonMoe
    from autotune.problems.models import Problem
    from autotune.measure.records import read_cache

    cache = read_cache(grid)
    device = DeviceInfo.from_dict(cache.device)
    rows = []
    for pk, pd in cache.problems.items():
        problem = Problem.from_dict(pd)
        for M in sorted({m.M for m in cache.records.values() if m.problem == pk}):
            up, down, found = sglang_selection(problem, M, device, str(configs))
            if not found:
                raise SystemExit(f"{configs} has no file for {pk} on {device.name}: nothing to compare")
            best = grid_optimum(cache, pk, M)
            tuned = pair_us(cache, pk, M, up, down)
            row = {"problem": pk, "M": M, "best_us": best, "tuned_us": tuned,
                   "gap": None if tuned is None else tuned / best - 1, "tuned": {"gate_up": up, "down": down}}
            for name, b in TritonMoe().baselines(problem, M, device).items():
                row[f"{name}_us"] = pair_us(cache, pk, M, b["gate_up"], b["down"])
            rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    f = lambda x: "-" if x is None else f"{x:.2f}"
    lines = ["| M | grid best us | tuned us | gap | default us | shipped us |", "|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        gap = "not in grid" if r["gap"] is None else f"{100 * r['gap']:+.2f}%"
        lines.append(f"| {r['M']} | {f(r['best_us'])} | {f(r['tuned_us'])} | {gap} | "
                     f"{f(r.get('default_us'))} | {f(r.get('shipped_us'))} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", required=True, help="tuned folder, e.g. tuned_configs/NVIDIA_H200")
    ap.add_argument("--grid", default=str(GRID), help="recorded full-grid cache")
    ap.add_argument("--max-gap", type=float, default=0.03)
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args(argv)
    rows = compare(args.configs, args.grid)
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    bad = [r for r in rows if r["gap"] is None or r["gap"] > args.max_gap]
    for r in bad:
        why = "its pair is not in the grid" if r["gap"] is None else f"{100 * r['gap']:+.2f}% off the grid's best"
        print(f"M={r['M']}: {why} (limit {100 * args.max_gap:.0f}%)", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
