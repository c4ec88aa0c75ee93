"""Warm start vs cold start on a real GPU: seconds until the search is within 2% of the best.

Reads the SQLite storages of `autotune run` pairs made by scripts/device_steps.sh's `warm` step
(same shape, same trials, same seed; one cold, one with --warm-start). The clock is the trials'
own completion times in the storage (Optuna records them): t = 0 at the run's first trial start,
so process start-up is not counted and every second after it is time the GPU was held. Per M: the
first moment the best (gate_up, down) pair measured so far that shares BLOCK_SIZE_M (what SGLang
can run: autotune.families.triton_moe.pairs.candidate_pairs, the metric of benchmarks/warm_start.py) is within 2% of
the best pair either run found, and the same for 5%; the first pair each run could form, and how far
it is from that best. These use the search-time measurements only. The selection's re-measurements
(after the search) give each run's selected pair: the fastest re-measured pair sharing BLOCK_SIZE_M,
what the run wrote (`selected_us`).

usage: python benchmarks/warm_start_h200.py COLD.db WARM.db [COLD.db WARM.db ...] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

TARGET = 1.02
NEAR = 1.05


def timeline(db: str) -> tuple[str, dict, dict]:
    """(problem key, {M: [(seconds from the run's first trial start, Measurement), ...] in completion order},
    {M: [the selection's re-measurements]})."""
    import optuna

    from autotune.measure.records import Measurement
    from autotune.store.storage import ATTR

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = f"sqlite:///{db}"
    rows, starts, problems, careful = {}, [], set(), {}
    for s in optuna.get_all_study_summaries(storage, include_best_trial=False):
        parts = s.study_name.split("|")
        if parts[0] != "triton_moe" or len(parts) != 5:
            continue
        problems.add(parts[2])
        study = optuna.load_study(study_name=s.study_name, storage=storage)
        for name, value in study.user_attrs.items():
            if name.startswith("careful:"):
                m = Measurement.from_dict(value)
                careful.setdefault(m.M, []).append(m)
        for t in study.get_trials(deepcopy=False):
            if t.datetime_start is not None:
                starts.append(t.datetime_start)
            if t.state == optuna.trial.TrialState.COMPLETE and ATTR in t.user_attrs:
                m = Measurement.from_dict(t.user_attrs[ATTR])
                rows.setdefault(m.M, []).append((t.datetime_complete, m))
    if len(problems) != 1:
        raise SystemExit(f"{db}: expected the studies of one problem, found {sorted(problems) or 'none'}")
    t0 = min(starts)
    return problems.pop(), {M: [((c - t0).total_seconds(), m) for c, m in sorted(v, key=lambda x: x[0])]
                            for M, v in rows.items()}, careful


def fastest_pair(ms) -> float | None:
    """µs of the fastest (gate_up, down) pair sharing BLOCK_SIZE_M among `ms`."""
    from autotune.families.triton_moe.pairs import candidate_pairs

    pairs = candidate_pairs([m for m in ms if m.gemm == "gate_up"], [m for m in ms if m.gemm == "down"], top=1)
    return pairs[0][2] if pairs else None


def best_over_time(events) -> list[tuple[float, float]]:
    """(t, best pair µs so far) each time the best pair improves."""
    from autotune.families.triton_moe.pairs import candidate_pairs

    seen = {"gate_up": [], "down": []}
    out = []
    for t, m in events:
        if not m.ok:
            continue
        seen[m.gemm].append(m)
        best = candidate_pairs(seen["gate_up"], seen["down"], top=1)
        if best and (not out or best[0][2] < out[-1][1]):
            out.append((t, best[0][2]))
    return out


def compare(cold_db: str, warm_db: str) -> dict:
    (pc, cold, cold_careful), (pw, warm, warm_careful) = timeline(cold_db), timeline(warm_db)
    if pc != pw:
        raise SystemExit(f"{cold_db} and {warm_db} tuned different problems ({pc} / {pw})")
    out = {"problem": pc, "per_M": {}}
    careful = {"cold": cold_careful, "warm": warm_careful}
    for M in sorted(set(cold) & set(warm)):
        curves = {"cold": best_over_time(cold[M]), "warm": best_over_time(warm[M])}
        best = min(c[-1][1] for c in curves.values() if c)
        row = {"best_us": best}
        for k, c in curves.items():
            row[f"{k}_s"] = next((t for t, us in c if us <= best * TARGET), None)
            row[f"{k}_s5"] = next((t for t, us in c if us <= best * NEAR), None)
            row[f"{k}_first_us"] = c[0][1] if c else None
            row[f"{k}_final_us"] = c[-1][1] if c else None
            row[f"{k}_search_s"] = (cold if k == "cold" else warm)[M][-1][0]
            row[f"{k}_selected_us"] = fastest_pair(careful[k].get(M, []))
        out["per_M"][M] = row
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dbs", nargs="+", help="cold and warm SQLite files, in pairs")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    if len(a.dbs) % 2:
        ap.error("give the storages in (cold, warm) pairs")
    for db in a.dbs:              # Optuna would create an empty SQLite file for a mistyped path
        if not Path(db).is_file():
            ap.error(f"{db}: no such SQLite file")
    results = [compare(a.dbs[i], a.dbs[i + 1]) for i in range(0, len(a.dbs), 2)]
    fmt = lambda x: "never" if x is None else f"{x:.1f}"  # noqa: E731
    for r in results:
        print(f"\n{r['problem']}: seconds from the first trial until the best pair is within 2% of the best of both runs")
        print("    M | best µs | cold s | warm s | cold final µs | warm final µs")
        for M, row in r["per_M"].items():
            print(f"{M:>5} | {row['best_us']:7.2f} | {fmt(row['cold_s']):>6} | {fmt(row['warm_s']):>6} | "
                  f"{row['cold_final_us']:13.2f} | {row['warm_final_us']:13.2f}")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
