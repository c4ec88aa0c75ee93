"""Selection: per M, the (gate_up, down) pair SGLang will run, declared only after re-measuring.

SGLang sorts tokens once per batch with the gate_up config's BLOCK_SIZE_M and runs both GEMMs
on that alignment, so a pair must share BLOCK_SIZE_M. Candidates are the best pairs per
BLOCK_SIZE_M by search-time measurements, plus SGLang's default and shipped pairs; the top
few are re-measured with more repeats, and the fastest re-measured pair wins. Baselines are
candidates, so the winner is never slower than them as measured.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from .records import Measurement, config_key
from .worker import Task

BASELINES = ("default", "shipped")


@dataclass
class Choice:
    M: int
    gate_up: dict
    down: dict
    gate_up_us: float
    down_us: float
    source: str                     # "tuned", "default" or "shipped"
    baseline_us: dict = field(default_factory=dict)   # name -> re-measured total (None if it failed)
    candidates: list = field(default_factory=list)    # [{gate_up, down, total_us, source}]

    @property
    def total_us(self) -> float:
        return self.gate_up_us + self.down_us

    def to_dict(self) -> dict:
        d = asdict(self)
        d["total_us"] = self.total_us
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Choice":
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


def candidate_pairs(gate_up: list[Measurement], down: list[Measurement], top: int, per_side: int = 2) -> list[tuple]:
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
    """Re-measure each M's candidates (all Ms' tasks at once, so compiles run in parallel)."""
    plan: dict = {}       # M -> list of (source, gate_up config, down config)
    for M in tuner.Ms:
        cands = [("tuned", g, d) for g, d, _ in candidate_pairs(
            tuner.ok_measurements("gate_up", M), tuner.ok_measurements("down", M), top)]
        for name in BASELINES:
            pair = tuner.baselines.get(M, {}).get(name)
            if pair and (name != "shipped" or tuner.settings.use_shipped) and not any(
                    tuner.family.unwritable(pair[g], g, tuner.device) for g in ("gate_up", "down")):
                cands.append((name, pair["gate_up"], pair["down"]))
        plan[M] = cands
    wanted: dict = {}     # (gemm, config_key) -> (config, [M])
    for M, cands in plan.items():
        for _, g, d in cands:
            for gemm, cfg in (("gate_up", g), ("down", d)):
                entry = wanted.setdefault((gemm, config_key(cfg)), (cfg, []))
                if M not in entry[1]:
                    entry[1].append(M)
    careful = tuner.careful   # re-measurements already in the storage (a resumed run reuses them)

    def done(task: Task, ms: list[Measurement]) -> None:
        for m in ms:
            tuner.store_careful(task.gemm, m)
    tasks = []
    for (gemm, ck), (cfg, Ms) in wanted.items():
        Ms = [M for M in Ms if (gemm, M, ck) not in careful]
        if Ms:
            tasks.append(tuner._task(gemm, cfg, Ms, tag="select", repeats=careful_repeats))
    tuner.run_tasks(tasks, done)

    choices: dict = {}
    for M, cands in plan.items():
        scored, baseline_us = [], {}
        for source, g, d in cands:
            mg, md = careful.get(("gate_up", M, config_key(g))), careful.get(("down", M, config_key(d)))
            total = mg.time_us + md.time_us if mg and md and mg.ok and md.ok else None
            if source in BASELINES:
                baseline_us[source] = total
            scored.append({"source": source, "gate_up": g, "down": d, "total_us": total,
                           "gate_up_us": mg.time_us if mg and mg.ok else None,
                           "down_us": md.time_us if md and md.ok else None})
        ok = [c for c in scored if c["total_us"] is not None]
        if not ok:
            continue
        # Ties go to the baseline: equal speed is no reason to ship a new config.
        win = min(ok, key=lambda c: (c["total_us"], c["source"] == "tuned"))
        choices[M] = Choice(M, win["gate_up"], win["down"], win["gate_up_us"], win["down_us"], win["source"],
                            baseline_us, scored)
    return choices
