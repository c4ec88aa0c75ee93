"""The per-M pick made as SGLang serves the layer (on a GPU, after the selection's re-measurements).

The selection re-measures each GEMM alone and ranks (gate_up, down) pairs by the sum of the two. SGLang runs a
pair as one layer, and the sum can rank pairs otherwise (a pair whose down kernel runs slower after that
gate_up, a launch option the GEMM alone does not show). So, per M, the selection's best tuned pairs (TOP_PAIRS
of them, by the re-measured sums) and SGLang's shipped and default pairs are each written as SGLang's files and
timed as SGLang's own MoE block loads and runs them (autotune.families.triton_moe.layer_timing). The fastest is
written; a tuned pair only where it beats the faster of SGLang's two beyond the measured spread, so ties go to
what SGLang runs untuned and the written file never makes the layer slower than SGLang's own files, as measured.
What was timed and decided goes to provenance (per_M[M]["layer"]).
"""
from __future__ import annotations

from autotune.families.triton_moe.layer_timing import (BASELINES, DEFAULT, SHIPPED, LayerError, empty_folder,
                                                      faster, fastest, write_side)
from autotune.families.triton_moe.costs import REPEATS, TOP_PAIRS

def candidates(choice) -> dict:
    """side name -> the re-measured candidate it runs (an autotune.search.finalists.Scored pair): "tuned1".."tunedK"
    by re-measured sum, "shipped" and "default" where the selection had them."""
    rows = [s for s in choice.candidates if s.total_us is not None]
    tuned = sorted((s for s in rows if s.finalist.source not in BASELINES), key=lambda s: s.total_us)[:TOP_PAIRS]
    out = {f"tuned{i}": s for i, s in enumerate(tuned, 1)}
    out.update({s.finalist.source: s for s in rows if s.finalist.source in BASELINES})
    return out


def _pair(scored) -> tuple:
    """(gate_up, down) of a scored candidate."""
    return scored.finalist.configs["gate_up"], scored.finalist.configs["down"]


def side_folders(problem, device, cands: dict, root) -> dict:
    """side name -> the config folder SGLang serves it from: SGLang's own (None) for its shipped pair, an empty
    one for its default, and for each tuned rank a folder holding that rank's pair at every M it has one."""
    ranks: dict = {}
    for M, sides in cands.items():
        for name, scored in sides.items():
            if name not in BASELINES:
                ranks.setdefault(name, {})[M] = _pair(scored)
    folders = {name: write_side(root, name, problem, device, pairs) for name, pairs in ranks.items()}
    return {**folders, SHIPPED: None, DEFAULT: empty_folder(root)}


def decide(row: dict, sides) -> str:
    """The side written: the selection's pick (tuned1), or another tuned side that beats it beyond the noise, where
    that beats the faster baseline beyond the noise of the two (autotune.measure.timing.noise), else that baseline."""
    base = fastest(row, [s for s in sides if s in BASELINES])
    tuned = [s for s in sides if s not in BASELINES]
    if not tuned:
        return base
    best = tuned[0]          # the selection's pick, unless another tuned pair beats it beyond the noise
    for s in tuned[1:]:
        if faster(row, s, best):
            best = s
    return best if faster(row, best, base) else base


def _same(loaded, meant) -> bool:
    from autotune.families.triton_moe.schema import entry_config

    up, down = (entry_config(c) for c in meant)
    return (entry_config(loaded[0]), entry_config(loaded[1])) == (up, down.with_params(BLOCK_SIZE_M=up["BLOCK_SIZE_M"]))


def confirm_by_layer(problem, choices: dict, device, *, timer=None, repeats: int = REPEATS, root=None,
                     pace=None) -> dict:
    """M -> {"us": {side: µs}, "spread": {side: spread}, "picked": side, "source": what it runs, "vs_sglang",
    "pick_was": the selection's pick where the layer chose another} for every M with SGLang's default pair among
    its candidates; `choices` is changed in place where another candidate is written. `timer(sides, M, repeats)`
    -> a layer_timing.time_sides row (default: SGLang's own block on this GPU); `pace` (autotune.measure.pool.Pace)
    is told the seconds the check held the GPU."""
    import tempfile

    from autotune.search.finalists import Choice

    cands = {M: c for M, c in ((M, candidates(ch)) for M, ch in choices.items()) if DEFAULT in c}
    if not cands:
        return {}
    own = None
    if timer is None:
        from autotune.families.triton_moe.layer_timing import LayerTimer, time_sides
        own = LayerTimer(problem, device)
        timer = lambda sides, M, n: time_sides(own, sides, [M], n)[0]     # noqa: E731
    root = root or (own.scratch if own is not None else tempfile.mkdtemp(prefix="autotune-layer-"))
    try:
        folders = side_folders(problem, device, cands, root)
        out = {}
        for M in sorted(cands):
            sides = {name: folders[name] for name in cands[M]}
            row = timer(sides, M, repeats)
            for name, r in cands[M].items():
                loaded = row.get(f"{name} loads")
                if loaded is not None and not _same(loaded, _pair(r)):
                    raise LayerError(f"M={M}: SGLang loads {loaded} for the {name} side, not the pair meant "
                                     f"({_pair(r)[0].to_entry()}, {_pair(r)[1].to_entry()})")
            side = decide(row, sides)
            c, r = choices[M], cands[M][side]
            rec = {"us": {s: round(row[f"{s} µs"], 3) for s in sides},
                   "spread": {s: round(row[f"{s} spread"], 4) for s in sides}, "picked": side, "source": r.finalist.source,
                   # the written pair against the faster of SGLang's own (negative: faster)
                   "vs_sglang": round(row[f"{side} µs"] / row[f"{fastest(row, [s for s in sides if s in BASELINES])} µs"] - 1, 4)}
            if _pair(r) != (c.gate_up, c.down):
                rec["pick_was"] = c.source
                choices[M] = Choice.pair(M, _pair(r), (r.times["gate_up"], r.times["down"]), r.finalist.source,
                                         c.baseline_us, c.candidates)
            out[M] = rec
        return out
    finally:
        if own is not None:
            if pace is not None:
                pace.layer_s += own.held_s
            own.close()


def confirm_picks(tuner, choices: dict, attempt):
    """On a GPU: each M's pick made as SGLang serves the layer (confirm_by_layer), the rest of the run's picks
    left as the selection made them. A replay has no layer to time: its picks stand on the recorded per-GEMM
    times. The check runs in the run's own process, held to its share of the GPU memory plan; where it fails
    (out of memory, say) `attempt` says so and the selection's picks are written. Returns what provenance
    records per M ("layer") and the run's table shows (layer_columns)."""
    from autotune.contract.protocol import Checked

    problem, device, pool = tuner.problem, tuner.device, tuner.pool
    if device.kind != "gpu":
        return Checked(STEP)
    fraction = pool.main_fraction() if hasattr(pool, "main_fraction") else None
    try:
        if fraction is not None:
            import torch

            from autotune.gpus.memory_plan import limit_process
            gpu = pool.memory_plan.gpus[0].index
            torch.cuda.set_device(gpu)
            limit_process(fraction, gpu)
        layer = attempt(f"the layer check of {problem.key}", confirm_by_layer, problem, choices, device,
                        pace=getattr(pool, "pace", None), let_through=LayerError) or {}
    except LayerError as e:       # a side that computes wrong numbers: say it, keep the selection's picks
        print(f"  layer check of {problem.key} not done: {e}")
        return Checked(STEP)
    finally:                      # the workers' next phase may need what this process held
        import gc

        import torch
        gc.collect()
        torch.cuda.empty_cache()
    for M, rec in sorted(layer.items()):
        if "pick_was" in rec:
            others = ", ".join(f"{s} {us:.1f}" for s, us in rec["us"].items() if s != rec["picked"])
            print(f"  M={M}: as SGLang runs the layer, {rec['picked']} ({rec['source']}) "
                  f"{rec['us'][rec['picked']]:.1f} µs is written, not the selection's {rec['pick_was']} pick ({others} µs)")
    return Checked(STEP, {M: {"layer": rec} for M, rec in layer.items()}, layer_columns(layer, choices))


STEP = "layer check"          # what the run's time line calls it


def layer_columns(layer: dict, choices: dict) -> dict:
    """Per M of the run's table (where the layer check ran): the written pair and the faster of SGLang's own,
    timed as SGLang serves the layer, and the speedup between them."""
    out = {}
    for M in sorted(set(choices) | set(layer)) if layer else ():
        rec = layer.get(M) or {}
        us = rec.get("us", {})
        sglang = min((us[s] for s in (SHIPPED, DEFAULT) if s in us), default=None)
        written = us.get(rec.get("picked"))
        out[M] = {"layer written µs": written, "layer SGLang µs": sglang,
                  "layer speedup": sglang / written if written and sglang else None}
    return out
