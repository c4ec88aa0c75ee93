"""Summarise a measurement cache: statuses, failure reasons, compile/timing cost, best per M.

usage: python benchmarks/cache_summary.py CACHE [CACHE ...]
"""
from __future__ import annotations

import collections
import statistics
import sys

from autotune.measure.records import merge_caches


def main(paths: list[str]) -> None:
    cache = merge_caches(paths)
    dev = cache.device
    print(f"device {dev.get('name')} SM{dev.get('sm')} versions {dev.get('versions')}")
    by = collections.defaultdict(list)
    for m in cache.records.values():
        by[(m.problem, m.gemm)].append(m)
    for (prob, gemm), ms in sorted(by.items()):
        st = collections.Counter(m.status for m in ms)
        comp = [m.compile_s for m in ms if m.compile_s > 0.5]
        bench = [m.bench_s for m in ms if m.ok]
        print(f"\n{prob} {gemm}: {len(ms)} records {dict(st)}; first-launch s median "
              f"{statistics.median(comp) if comp else 0:.2f} (n={len(comp)}), timing s median "
              f"{statistics.median(bench) if bench else 0:.3f}, sum {sum(bench):.0f}")
        reasons = collections.Counter(m.reason.split(":")[0][:80] for m in ms if not m.ok)
        for r, n in reasons.most_common(5):
            print(f"   {n:5d} x {r}")
        for M in sorted({m.M for m in ms}):
            oks = sorted((m for m in ms if m.M == M and m.ok), key=lambda m: m.time_us)
            if oks:
                b = oks[0]
                print(f"   M={M:5d}: {len(oks):5d} ok, best {b.time_us:9.2f} us (spread {b.spread:.3f}, err {b.error:.1e}) {b.config}")


if __name__ == "__main__":
    main(sys.argv[1:])
