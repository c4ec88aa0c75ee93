"""Selection: per M, the (gate_up, down) pair SGLang will run, declared only after re-measuring.

SGLang sorts tokens once per batch with the gate_up config's BLOCK_SIZE_M and runs both GEMMs
on that alignment, so a pair must share BLOCK_SIZE_M. Candidates are the best pairs per
BLOCK_SIZE_M by search-time measurements, plus SGLang's default and shipped pairs; the top
few are re-measured with more repeats, and the fastest re-measured pair wins (the selection step
every family shares: autotune.search.finalists). Baselines are finalists, so the winner is never slower
than them as measured.
"""
from __future__ import annotations

from autotune.search.finalists import TUNED, Choice, Finalist, remeasure, score, winner
from autotune.contract.config import KernelConfig
from autotune.measure.records import Measurement

BASELINES = ("default", "shipped")


def candidate_pairs(gate_up: list[Measurement], down: list[Measurement], top: int,
                    per_side: int = 2) -> list[tuple[KernelConfig, KernelConfig, float]]:
    """Top pairs (gate_up config, down config, estimated total us) sharing BLOCK_SIZE_M."""
    def by_bm(ms):
        out: dict = {}
        for m in sorted((m for m in ms if m.ok), key=lambda m: m.time_us):
            out.setdefault(m.config["BLOCK_SIZE_M"], []).append(m)
        return out
    gu, dn = by_bm(gate_up), by_bm(down)
    pairs = [(a.config, b.config, a.time_us + b.time_us)
             for bm in set(gu) & set(dn) for a in gu[bm][:per_side] for b in dn[bm][:per_side]]
    pairs.sort(key=lambda p: p[2])
    return pairs[:top]


def select_problem(tuner, top: int, careful_repeats: int) -> dict[int, Choice]:
    """Per M: the top pairs and SGLang's default and shipped pairs, re-measured (all Ms' tasks at
    once, so compiles run in parallel); the fastest wins (autotune.search.finalists)."""
    plan: dict = {}       # M -> [Finalist]
    for M in tuner.Ms:
        cands = [Finalist(TUNED, {"gate_up": g, "down": d}) for g, d, _ in candidate_pairs(
            tuner.ok_measurements("gate_up", M), tuner.ok_measurements("down", M), top)]
        for name in BASELINES:
            pair = tuner.baselines.get(M, {}).get(name)
            if pair and (name != "shipped" or tuner.settings.use_shipped) and not any(
                    tuner.family.unwritable(pair[g], g, tuner.device) for g in ("gate_up", "down")):
                cands.append(Finalist(name, {"gate_up": pair["gate_up"], "down": pair["down"]}))
        plan[M] = cands
    # re-measurements already in the storage (a resumed run reuses them)
    remeasure(plan, tuner.careful,
              lambda gemm, cfg, Ms: tuner.task(gemm, cfg, Ms, tag="select", repeats=careful_repeats),
              tuner.run_tasks, tuner.store_careful)

    choices: dict = {}
    for M, cands in plan.items():
        scored = score(cands, M, tuner.careful)
        win = winner(scored)
        if win is None:
            continue
        baseline_us = {s.finalist.source: s.total_us for s in scored if s.finalist.source in BASELINES}
        choices[M] = Choice.pair(M, (win.finalist.configs["gate_up"], win.finalist.configs["down"]),
                                 (win.times["gate_up"], win.times["down"]), win.finalist.source, baseline_us, scored)
    return choices


def why_no_pair(tuner, M: int) -> str:
    """Why the selection found no (gate_up, down) pair at M that ran correctly."""
    from collections import Counter

    from autotune.measure.records import INVALID

    parts = []
    for g in tuner.family.gemms:
        ms = [m for m in tuner.measured[g, M].values() if m.status != INVALID]
        if not any(m.ok for m in ms):
            counts = ", ".join(f"{n} {status}" for status, n in Counter(m.status for m in ms).most_common())
            first = next((m.reason for m in ms if m.reason), "")
            parts.append(f"no {g} config ran correctly ({counts or 'none measured'}" +
                         (f"; e.g. {first[:160]}" if first else "") + ")")
    return "; ".join(parts) or f"no re-measured pair sharing {tuner.family.coupled} ran correctly"
