"""The per-M pick, confirmed as SGLang runs the layer (on a GPU, after the selection).

The selection re-measures each GEMM alone and adds the two times. SGLang runs them as one layer:
alignment, gate_up, the activation, down, in its order (with TMA on down for block-FP8, gate_up
writes its rows sorted and down reads them as they are), so the sum can rank two pairs differently
from the layer. Here, per M, the layer (autotune.validate.moe_sides) is timed with the pick, SGLang's
shipped pair and its default pair, each first checked against the float32 reference, in turns;
where a baseline is faster than the pick beyond the measured spread, the baseline's pair is what
gets written. The layer times and what was decided go to provenance (per_M[M]["layer"]).
"""
from __future__ import annotations

from pathlib import Path

from .validate.moe_sides import MoeSides, SideConfig, time_sides

# The smallest difference ever acted on, whatever the spread says.
MIN_EFFECT = 0.01
# moe_sides' sides: "tuned" = the pick, "default" = what SGLang loads from its own folder (its shipped
# file, else its default config), "heuristic" = SGLang's default config.
BASELINE_OF_SIDE = {"default": "shipped", "heuristic": "default"}


class PairSides(MoeSides):
    """MoeSides whose configs are given per M and side instead of read from folders."""

    def __init__(self, problem, device, pairs: dict, **kw):
        super().__init__(problem, device, Path("."), **kw)
        self._sides = pairs


def baseline_rows(choice) -> dict:
    """moe_sides side -> the re-measured baseline row (a {source, gate_up, down, gate_up_us,
    down_us, total_us} candidate of the selection) it runs; without a shipped pair SGLang's own
    folder gives its default, so both baseline sides run the default pair."""
    rows = {r["source"]: r for r in choice.candidates if r.get("total_us") is not None}
    if "default" not in rows:
        return {}
    return {"default": rows.get("shipped", rows["default"]), "heuristic": rows["default"]}


def confirm_by_layer(problem, choices: dict, device, *, timer=None, repeats: int = 3) -> dict:
    """M -> {"us": {pick, shipped, default}, "spread", "kept" | "switched_to" and "margin"} for every
    M whose default pair was re-measured; `choices` is changed in place where a baseline wins."""
    from .select import Choice

    timer = timer or time_sides
    baselines = {M: baseline_rows(c) for M, c in choices.items()}
    Ms = sorted(M for M, b in baselines.items() if b)
    if not Ms:
        return {}
    pairs = {}
    for M in Ms:
        c = choices[M]
        pairs[M, "tuned"] = SideConfig(c.gate_up, c.down, True, f"the pick ({c.source})")
        for side, row in baselines[M].items():
            pairs[M, side] = SideConfig(row["gate_up"], row["down"], True, f"SGLang's {row['source']} pair")
    out = {}
    for row in timer(PairSides(problem, device, pairs), Ms, repeats):
        M, c = row["M"], choices[row["M"]]
        t = row["tuned µs"]
        best = min(BASELINE_OF_SIDE, key=lambda s: row[f"{s} µs"])
        noise = max(MIN_EFFECT, row["tuned spread"], row[f"{best} spread"])
        rec = {"us": {"pick": round(t, 3), **{BASELINE_OF_SIDE[s]: round(row[f"{s} µs"], 3) for s in BASELINE_OF_SIDE}},
               "spread": round(noise, 4)}
        src = baselines[M][best]
        if t > row[f"{best} µs"] * (1 + noise) and (src["gate_up"], src["down"]) != (c.gate_up, c.down):
            choices[M] = Choice(M, src["gate_up"], src["down"], src["gate_up_us"], src["down_us"], src["source"],
                                c.baseline_us, c.candidates)
            rec.update(switched_to=src["source"], margin=round(t / row[f"{best} µs"] - 1, 4))
        else:
            rec["kept"] = c.source
        out[M] = rec
    return out
