"""The one selection step every family goes through: per M, the finalists are re-measured with
more repeats and the fastest correct one wins; nothing is declared on search-time numbers.

A finalist is a source ("tuned", or the name of what SGLang runs untuned: "default", "shipped",
"auto") and one config per GEMM of the family: a Triton MoE (gate_up, down) pair, a backend
choice's {"layer": {"backend", "tactic"}}. Its time is the sum of its GEMMs' re-measured times.
Ties go to the baseline: equal speed is no reason to ship a change. Re-measurements are keyed
(gemm, M, config key) and stored by the caller, so a resumed run re-measures nothing twice.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from autotune.contract.backend_family import LAYER
from autotune.contract.config import KernelConfig
from autotune.measure.records import Measurement

TUNED = "tuned"
PAIR = ("gate_up", "down")      # a Triton MoE pair's parts, in the order its configs and times are given


@dataclass
class Finalist:
    source: str
    configs: dict[str, KernelConfig]       # gemm -> config


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
                if (gemm, M, cfg.key) in careful:
                    continue
                Ms = wanted.setdefault((gemm, cfg), (gemm, cfg, []))[2]
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
            m: Measurement | None = careful.get((gemm, M, cfg.key))
            times[gemm] = m.time_us if m is not None and m.ok else None
        out.append(Scored(f, times))
    return out


def winner(scored: list[Scored]) -> Scored | None:
    """The fastest correct finalist; ties go to a baseline."""
    ok = [s for s in scored if s.total_us is not None]
    return min(ok, key=lambda s: (s.total_us, s.finalist.source == TUNED)) if ok else None


@dataclass
class Choice:
    """Per M, what the winning finalist runs: its config and re-measured time per part (a Triton
    family's GEMMs, or the backend family's one layer), its source, the baselines' re-measured
    totals beside it and every finalist scored. Both families' files keep their own shape
    (`to_dict`), so what was written before reads back the same."""
    M: int
    configs: dict[str, KernelConfig]   # part -> config
    times: dict                     # part -> re-measured us
    source: str = TUNED             # "tuned", or the baseline that won ("default", "shipped", "auto")
    baseline_us: dict = field(default_factory=dict)   # baseline name -> re-measured total (None if it failed)
    candidates: list[Scored] = field(default_factory=list)    # the finalists, scored

    def __post_init__(self):
        if not all(isinstance(c, KernelConfig) for c in self.configs.values()) or not all(
                isinstance(s, Scored) for s in self.candidates):
            raise TypeError("a choice holds KernelConfig values and its candidates scored finalists "
                            "(to_dict/from_dict are the files' form)")

    @classmethod
    def pair(cls, M: int, configs: tuple[KernelConfig, KernelConfig], times: tuple[float, float], source: str = TUNED,
             baseline_us: dict | None = None, candidates: list | None = None) -> "Choice":
        """A Triton MoE pair: `configs` (gate_up, down) and their re-measured `times`, in that order."""
        return cls(M, dict(zip(PAIR, configs)), dict(zip(PAIR, times)), source,
                   dict(baseline_us or {}), list(candidates or []))

    @classmethod
    def layer(cls, M: int, config: KernelConfig, time_us: float, base_us: float | None, candidates: list | None = None,
              base: str = "auto") -> "Choice":
        """A backend (and tactic) for the whole layer, beside `base` (SGLang's auto, or the tactic -1)."""
        return cls(M, {LAYER: config}, {LAYER: time_us}, TUNED, {base: base_us}, list(candidates or []))

    @property
    def total_us(self) -> float:
        return sum(self.times.values())

    # the pair's parts
    gate_up = property(lambda self: self.configs["gate_up"])
    down = property(lambda self: self.configs["down"])
    gate_up_us = property(lambda self: self.times["gate_up"])
    down_us = property(lambda self: self.times["down"])
    # the layer's
    config = property(lambda self: self.configs[LAYER])
    time_us = property(lambda self: self.times[LAYER])
    auto_us = property(lambda self: next(iter(self.baseline_us.values()), None))

    def to_dict(self) -> dict:
        """The choice as a file records it (its configs as entries, its candidates as rows)."""
        if set(self.configs) == {LAYER}:
            return {"M": self.M, "config": self.config.to_entry(), "time_us": self.time_us, "auto_us": self.auto_us,
                    "candidates": [{"config": s.finalist.configs[LAYER].to_entry(), "time_us": s.total_us}
                                   for s in self.candidates]}
        return {"M": self.M, "gate_up": self.gate_up.to_entry(), "down": self.down.to_entry(),
                "gate_up_us": self.gate_up_us, "down_us": self.down_us, "source": self.source,
                "baseline_us": dict(self.baseline_us), "candidates": [_pair_row(s) for s in self.candidates],
                "total_us": self.total_us}

    @classmethod
    def from_dict(cls, d: dict) -> "Choice":
        """A choice `to_dict` wrote."""
        entry = KernelConfig.from_entry
        if "config" in d:
            return cls.layer(d["M"], entry(d["config"]), d["time_us"], d.get("auto_us"),
                             [Scored(Finalist(TUNED, {LAYER: entry(r["config"])}), {LAYER: r["time_us"]})
                              for r in d.get("candidates", [])])
        return cls.pair(d["M"], (entry(d["gate_up"]), entry(d["down"])), (d["gate_up_us"], d["down_us"]),
                        d.get("source", TUNED), d.get("baseline_us"),
                        [Scored(Finalist(r["source"], {g: entry(r[g]) for g in PAIR}), {g: r[f"{g}_us"] for g in PAIR})
                         for r in d.get("candidates", [])])


def _pair_row(s: Scored) -> dict:
    """A scored pair as the files record it."""
    f = s.finalist
    return {"source": f.source, "gate_up": f.configs["gate_up"].to_entry(), "down": f.configs["down"].to_entry(),
            "total_us": s.total_us, "gate_up_us": s.times["gate_up"], "down_us": s.times["down"]}
