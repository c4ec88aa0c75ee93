"""What a run will do and roughly what it will cost, said before it starts (`run --dry-run` prints
only this; every run prints it first).

The cost model is the replay's (autotune.replay): a measurement costs its recorded timing
seconds plus its compile seconds shared by the recording's parallel compilers. Per measurement
the mean comes from the --replay recording, or else from the committed H200 bf16 run (labelled:
another GPU compiles and times at another speed). Measurements per study: the trial budget, each
trial also measured at `neighbours` adjacent batch sizes on each side, plus selection's careful
re-measurements of the top candidates and SGLang's baselines.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .backends import runners

REFERENCE = Path(__file__).resolve().parent.parent / "benchmarks/data/h200_run_bf16_2026-12-01.jsonl.gz"
CAREFUL_PER_M = 5 * 2      # top 3 + default + shipped pairs, both GEMMs
# The H200 bf16 run of 2026-12-01: 243.7 s of wall time against 121 s of this model for its 4500 planned
# measurements (docs/PERFORMANCE.md): worker start-up, JIT builds and scheduling are not in the recording.
WALL_FACTOR = 2.0
# Backend families: a default and a re-measurement per available backend, ~8 measurements per (problem, M);
# each backend with FlashInfer tactics adds what its runner lists there, known only on the GPU. The H200
# fp8_gemm run of 2026-12-03 (cuBLAS + cuDNN: 544 measurements for 4 shapes x 4 M) averaged ~13 per
# tunable backend per (problem, M).
BACKENDS_PER_M = 8
TACTICS_PER_TUNABLE = 13


@dataclass
class Scope:
    lines: list[str]
    measurements: int
    device_s: float | None
    basis: str


def mean_cost(cache) -> float:
    parallel = int(cache.notes.get("compile_workers", 15))
    ms = [m for m in cache.records.values() if m.ok]
    return sum(m.bench_s + m.compile_s / parallel for m in ms) / len(ms) if ms else 0.0


def scope(plans, tps, trials: int, neighbours: int, budget_s: float | None, cache=None) -> Scope:
    from .records import CacheError, read_cache

    lines, total = [], 0
    for fp in plans:
        if fp.unsupported or not fp.problems:
            continue
        if fp.name == "triton_moe":
            per = [len(p.batch_sizes) * len(fp.family.gemms) for p in fp.problems]
            n = sum(k * trials * (1 + 2 * neighbours) for k in per) + \
                sum(len(p.batch_sizes) * CAREFUL_PER_M for p in fp.problems)
            lines.append(f"  {fp.name}: {len(fp.problems)} problems x {len(fp.family.gemms)} GEMMs x batch sizes "
                         f"({', '.join(str(len(p.batch_sizes)) for p in fp.problems)}) = {sum(per)} studies of "
                         f"{trials} trials; ~{n} measurements")
        else:
            tunable = sum(r.tunable and r.name not in fp.family.skip for r in runners(fp.name))
            n = sum(len(p.batch_sizes) for p in fp.problems) * (BACKENDS_PER_M + TACTICS_PER_TUNABLE * tunable)
            tactics = (f", and every tactic FlashInfer's runners list for its {tunable} backend{'s' * (tunable != 1)} with tactics "
                       f"(~{TACTICS_PER_TUNABLE} each per shape and batch size on the H200)" if tunable else "")
            lines.append(f"  {fp.name}: {len(fp.problems)} problems, every available backend at every batch size"
                         f"{tactics}; ~{n} measurements")
        total += n
    basis, cost = "", None
    try:
        ref = cache if cache is not None else read_cache(REFERENCE)
        cost = mean_cost(ref)
        basis = ("the replayed recording" if cache is not None else
                 f"the H200 bf16 recording ({REFERENCE.name}); another GPU differs")
    except CacheError:
        pass
    device_s = total * cost if cost else None
    head = [f"scope: TP {','.join(map(str, tps))}; {total} measurements planned"]
    if device_s is not None:
        est = f"~{device_s / 60:.0f} min" if device_s >= 90 else f"~{device_s:.0f} s"
        head[0] += (f", {est} of recorded compile and timing seconds (from {basis}; the H200 bf16 run took about "
                    f"{WALL_FACTOR:.0f}x that in wall time)")
        if budget_s is not None and budget_s < device_s:
            head.append(f"  --budget {budget_s:.0f} s stops it before that: the studies get what fits")
        elif budget_s is None and device_s > 3600:
            head.append("  no --budget: this runs until every study has its trials; --budget 1h (say) bounds it, "
                        "--model/--tp/--dtype narrow it")
    return Scope(head + lines, total, device_s, basis)
