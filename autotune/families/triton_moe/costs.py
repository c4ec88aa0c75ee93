"""What the fused-MoE family's steps after the search cost, for the budget to keep them room (autotune.search.study
ProblemTuner.after_search_s): the finalists' careful re-measurements and the layer check that picks among them
(autotune.families.triton_moe.pairs, autotune.families.triton_moe.confirm), and how many of each the check runs."""
from __future__ import annotations

# The selection's careful re-measurements per batch size (the top pairs' and SGLang's two pairs' configs of
# both GEMMs) and what one costs against a search measurement's GPU seconds (21 timed replays, not 7, after the
# same warm-up; no first launch, no reference, no compile): on the H100 the selection took 7-10 s where 2.0 kept
# 13 s (d5, 2026-12-06: 7 s for 18 batch sizes at 0.035 s a search measurement, 1.1 of one).
CAREFUL_PER_M = 10
CAREFUL_COST = 1.3

# Tuned pairs timed as a layer per M, besides SGLang's two: on the H100 a third one was written at no batch size
# of two runs where the first two were timed (it never beat the pick beyond the noise).
TOP_PAIRS = 2
REPEATS = 3          # turns of every side per M
# What the budget keeps for the layer check, measured on the H100 (Qwen3.5-397B TP8 bf16, 18 batch sizes): its
# set-up (SGLang's fused-MoE module imported, one layer's experts made) and, per batch size and side, a check or a
# timing: 25-52 s in nine runs (median 35 s) for 288 of them (18 batch sizes x 4 sides x 4 turns), 0.06-0.15 s
# each; the budget keeps about the median, and the slowest seen still ends inside the budget's 10%. Not the
# search's seconds a measurement: the layer runs in this process, through SGLang's Python, with its own first
# launches, whatever the search's warm-up (a reserve scaled on the search's pace fell 27 s short once the search
# measured faster).
LAYER_SETUP_S = 8.0
LAYER_STEP_S = 0.10


def layer_check_s(n_Ms: int) -> float:
    return LAYER_SETUP_S + n_Ms * (TOP_PAIRS + 2) * (REPEATS + 1) * LAYER_STEP_S


def after_search_s(n_Ms: int, per_s: float, workers: int, on_gpu: bool) -> float:
    """Seconds the careful re-measurements (at `per_s` a search measurement, over `workers` measuring processes)
    and, on a GPU, the layer check take for a problem of `n_Ms` batch sizes."""
    careful = n_Ms * CAREFUL_PER_M * per_s * CAREFUL_COST / workers
    return careful + (layer_check_s(n_Ms) if on_gpu else 0.0)
