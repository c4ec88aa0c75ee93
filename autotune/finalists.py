"""The one selection step every family goes through: per M, the finalists are re-measured with
more repeats and the fastest correct one wins; nothing is declared on search-time numbers.

A finalist is a source ("tuned", or the name of what SGLang runs untuned: "default", "shipped",
"auto") and one config per GEMM of the family: a Triton MoE (gate_up, down) pair, a backend
choice's {"layer": {"backend", "tactic"}}. Its time is the sum of its GEMMs' re-measured times.
Ties go to the baseline: equal speed is no reason to ship a change. Re-measurements are keyed
(gemm, M, config key) and stored by the caller, so a resumed run re-measures nothing twice.
"""
from __future__ import annotations

from dataclasses import dataclass

from .records import Measurement, config_key

TUNED = "tuned"


@dataclass
class Finalist:
    source: str
    configs: dict            # gemm -> config


@dataclass
class Scored:
    finalist: Finalist
    times: dict              # gemm -> re-measured us (None where it failed or is missing)

    @property
    def total_us(self) -> float | None:
        if not self.times or any(t is None for t in self.times.values()):
            return None
        return sum(self.times.values())


def remeasure(finalists: dict[int, list[Finalist]], careful: dict, make_task, run_tasks, store) -> None:
    """Re-measure every finalist config not re-measured yet: one task per (gemm, config) over all
    the Ms that need it (compiled once, timed at each M)."""
    wanted: dict = {}
    for M, cands in finalists.items():
        for f in cands:
            for gemm, cfg in f.configs.items():
                if (gemm, M, config_key(cfg)) in careful:
                    continue
                Ms = wanted.setdefault((gemm, config_key(cfg)), (gemm, cfg, []))[2]
                if M not in Ms:
                    Ms.append(M)
    tasks = [make_task(gemm, cfg, Ms) for gemm, cfg, Ms in wanted.values()]
    if tasks:
        run_tasks(tasks, lambda task, ms: [store(task.gemm, m) for m in ms])


def score(finalists: list[Finalist], M: int, careful: dict) -> list[Scored]:
    out = []
    for f in finalists:
        times = {}
        for gemm, cfg in f.configs.items():
            m: Measurement | None = careful.get((gemm, M, config_key(cfg)))
            times[gemm] = m.time_us if m is not None and m.ok else None
        out.append(Scored(f, times))
    return out


def winner(scored: list[Scored]) -> Scored | None:
    """The fastest correct finalist; ties go to a baseline."""
    ok = [s for s in scored if s.total_us is not None]
    return min(ok, key=lambda s: (s.total_us, s.finalist.source == TUNED)) if ok else None
