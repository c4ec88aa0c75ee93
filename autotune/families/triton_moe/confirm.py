"""The per-M pick, confirmed as SGLang runs the layer (on a GPU, after the selection).

The selection re-measures each GEMM alone and adds the two times. SGLang runs them as one layer:
alignment, gate_up, the activation, down, in its order (with TMA on down for block-FP8, gate_up
writes its rows sorted and down reads them as they are), so the sum can rank two pairs differently
from the layer. Here, per M, the layer (autotune.families.triton_moe.moe_layer) is timed with the pick, SGLang's
shipped pair and its default pair, each first checked against the float32 reference, in turns;
where a baseline is faster than the pick beyond the measured spread (moe_layer.verdict, the rule
`autotune check` applies too), the baseline's pair is what gets written. The layer times and what
was decided go to provenance (per_M[M]["layer"]).
"""
from __future__ import annotations

from autotune.families.triton_moe.moe_layer import BASELINE_OF_SIDE, MoeSides, SideConfig, time_sides, verdict


def baseline_rows(choice) -> dict:
    """moe_layer side -> the re-measured baseline row (a {source, gate_up, down, gate_up_us,
    down_us, total_us} candidate of the selection) it runs; without a shipped pair SGLang's own
    folder gives its default, so both baseline sides run the default pair."""
    rows = {r["source"]: r for r in choice.candidates if r.get("total_us") is not None}
    if "default" not in rows:
        return {}
    return {"default": rows.get("shipped", rows["default"]), "heuristic": rows["default"]}


def confirm_by_layer(problem, choices: dict, device, *, timer=None, repeats: int = 3) -> dict:
    """M -> {"us": {pick, shipped, default}, "spread", "kept" | "switched_to" and "margin"} for every
    M whose default pair was re-measured; `choices` is changed in place where a baseline wins."""
    from autotune.search.finalists import Choice

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
    for row in timer(MoeSides(problem, device, ".", configs=pairs), Ms, repeats):
        M, c, v = row["M"], choices[row["M"]], verdict(row)
        rec = {"us": {"pick": round(row["tuned µs"], 3),
                      **{name: round(row[f"{side} µs"], 3) for side, name in BASELINE_OF_SIDE.items()}},
               "spread": round(v["noise"], 4)}
        src = baselines[M][v["side"]]
        if v["slower"] and (src["gate_up"], src["down"]) != (c.gate_up, c.down):
            choices[M] = Choice.pair(M, (src["gate_up"], src["down"]), (src["gate_up_us"], src["down_us"]), src["source"],
                                     c.baseline_us, c.candidates)
            rec.update(switched_to=src["source"], margin=round(row["tuned µs"] / v["us"] - 1, 4))
        else:
            rec["kept"] = c.source
        out[M] = rec
    return out
