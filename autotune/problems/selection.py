"""What to tune, read from a request's "what to tune" fields (--shapes, --model, --model-config, --tp,
--ep, --dtype, --batch-sizes): the models and sizes chosen, the fused-MoE problems they expand to, and
the note on problems that share one SGLang file."""
from __future__ import annotations

from typing import NamedTuple

from autotune.problems import models


class Selection(NamedTuple):
    models: list
    tps: tuple
    eps: tuple
    dtypes: tuple | None        # None: every dtype of the family
    batch_sizes: tuple


def selection(sel) -> Selection:
    """`sel`: a request with the "what to tune" fields (autotune.run.requests.TuneRequest)."""
    return Selection(models.select_models(sel.shapes, sel.model, sel.model_config),
                     models.parse_int_list(sel.tp, "--tp"), models.parse_int_list(sel.ep, "--ep"),
                     tuple(d.strip() for d in sel.dtype.split(",")) if sel.dtype is not None else None,
                     models.parse_int_list(sel.batch_sizes, "--batch-sizes", models.MAX_BATCH) if sel.batch_sizes
                     else models.DEFAULT_BATCH_SIZES)


def problems(sel) -> models.Expansion:
    chosen = selection(sel)
    return models.expand(chosen.models, chosen.tps, chosen.eps, chosen.dtypes or models.TRITON_DTYPES,
                         chosen.batch_sizes)


def shared_notes(exp) -> list[str]:
    """Where two problems map to one SGLang file: which one the file is tuned for."""
    out = []
    for key, others in exp.shared.items():
        owner = next(p for p in exp.problems if p.file_key == key)
        for o in others:
            who = ", ".join(sorted({f"{s[0]} tp{s[1]}" for s in o.sources}))
            out.append(f"note: {who} (K={o.K}, top_k={o.top_k}) maps to the same SGLang file as {owner.key}; "
                       f"that file is tuned for K={owner.K}, top_k={owner.top_k}")
    return out
