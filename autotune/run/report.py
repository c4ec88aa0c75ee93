"""Tables for people: per problem, M | default | shipped | tuned | speedup | trials | failed."""
from __future__ import annotations

import json

import pandas as pd

from autotune.contract.config import KernelConfig
from autotune.search.finalists import Choice


def problem_table(choices: dict[int, Choice], trials: dict[int, tuple[int, int]],
                  columns: dict[int, dict] | None = None) -> pd.DataFrame:
    """Per M: the per-GEMM re-measured sums (default, shipped, tuned), and where the family checked its picks as
    the server runs them, the columns it adds (`columns`: M -> its Checked.columns; empty where it did not)."""
    columns = columns or {}
    added = list(dict.fromkeys(name for per_m in columns.values() for name in per_m))
    rows = []
    for M in sorted(set(choices) | set(trials)):
        c = choices.get(M)
        n, failed = trials.get(M, (0, 0))
        default = c.baseline_us.get("default") if c else None
        shipped = c.baseline_us.get("shipped") if c else None
        ref = min((x for x in (default, shipped) if x is not None), default=None)
        row = {"M": M, "default µs": default, "shipped µs": shipped, "tuned µs": c.total_us if c else None,
               "speedup": (ref / c.total_us) if c and ref else None}
        row.update({name: columns.get(M, {}).get(name) for name in added})
        row.update({"trials": n, "failed": failed, "winner": c.source if c else "none"})
        rows.append(row)
    return pd.DataFrame(rows)


def pace_lines(pace: dict, budget_s: float | None) -> list[str]:
    """What the run says of its own pace (autotune.measure.pool.Pace.to_dict, over the whole run)."""
    out = [f"pace: {pace['measurements']} device measurements in {pace['wall_s']:.0f} s of wall time "
           f"({pace['measurements_per_s']:.1f}/s); the GPU was held for measuring {pace['gpu_held_s']:.0f} s, "
           f"{pace['gpu_busy_share']:.0%} of the run"]
    if pace["builds"] or pace["waited_for_builds_s"]:
        out.append(f"  compiling apart: {pace['builds']} kernels built in {pace['build_s']:.0f} builder-seconds; "
                   f"the GPU's process waited {pace['waited_for_builds_s']:.1f} s for builds and compiled "
                   f"{pace['compile_wait_s']:.1f} s itself" + (f"; {pace['builds_lost']} builds lost to a dead or "
                                                                "hung builder" if pace["builds_lost"] else ""))
    if budget_s is not None:
        out.append(f"  --budget {budget_s:.0f} s: {pace['wall_s']:.0f} s so far "
                   f"({pace['wall_s'] / budget_s - 1:+.0%}), the files written")
    return out


def backend_table(tuner, choices: dict) -> pd.DataFrame:
    """Per M: SGLang's auto backend and time, the winner and its time, every backend's search time."""
    auto = tuner.family.sglang_auto(tuner.device)
    # a column per declared backend; a value SGLang lists and no module declares only where it ran
    # (its refusal is a `disqualified` line: on SM90 that is every one of them)
    shown = [b for b in tuner.names if _declared(tuner.family, b) or any(tuner.time_of(b, M) for M in tuner.Ms)]
    rows = []
    for M in tuner.Ms:
        c = choices.get(M)
        row = {"M": M, "auto": auto or "-", "auto µs": c.auto_us if c else None,
               "best": backend_label(c.config) if c else "none", "best µs": c.time_us if c else None,
               "speedup": (c.auto_us / c.time_us) if c and c.auto_us else None}
        for b in shown:
            row[f"{b} µs"] = tuner.time_of(b, M)
        rows.append(row)
    return pd.DataFrame(rows)


def _declared(family, name: str) -> bool:
    return getattr(family.runner(name), "declared", True)


def tactic_table(tuner, pinned: dict) -> pd.DataFrame:
    """Per tunable backend and M: its default (-1) and its best tactic, both re-measured (with the
    best one's spread: (p75 - p25) / median over its timed replays)."""
    from autotune.contract.backend_family import LAYER

    rows = []
    for b, per_m in sorted(pinned.items()):
        for M, c in sorted(per_m.items()):
            m = tuner.careful.get((LAYER, M, c.config.key))
            rows.append({"backend": b, "M": M, "-1 µs": c.auto_us, "tactic": json.dumps(c.config.get("tactic", -1)),
                         "tactic µs": c.time_us, "spread": m.spread if m is not None else None,
                         "speedup": (c.auto_us / c.time_us) if c.auto_us else None})
    return pd.DataFrame(rows)


def backend_label(config: KernelConfig) -> str:
    """A backend, with its tactic where it is not the default: `flashinfer_cudnn tactic [3, []]`."""
    tactic = config.get("tactic", -1)
    return config["backend"] if tactic == -1 else f"{config['backend']} tactic {json.dumps(tactic)}"


def table_records(df: pd.DataFrame) -> list[dict]:
    """A report table as JSON-ready rows (missing values as null)."""
    return [{k: (None if isinstance(v, float) and pd.isna(v) else v.item() if hasattr(v, "item") else v)
             for k, v in row.items()} for row in df.to_dict(orient="records")]


def format_table(df: pd.DataFrame) -> str:
    def fmt(col, v):
        if v is None or (isinstance(v, float) and pd.isna(v)):
            return "-"
        if col.endswith("speedup"):
            return f"{v:.3f}x"
        if col == "spread":
            return f"{v:.1%}"
        if col.endswith("µs"):
            return f"{v:.2f}"
        return str(v)
    cols = list(df.columns)
    body = [[fmt(c, r[c]) for c in cols] for r in df.to_dict("records")]
    widths = [max(len(c), *(len(b[i]) for b in body)) if body else len(c) for i, c in enumerate(cols)]
    line = lambda cells: " | ".join(x.rjust(w) for x, w in zip(cells, widths))  # noqa: E731
    return "\n".join([line(cols), "-+-".join("-" * w for w in widths)] + [line(b) for b in body])
