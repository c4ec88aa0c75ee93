"""Warm start: a new study begins with the best configs another GPU's or shape's study found.

The source is a measurement cache (`--record` / `autotune record` files) or an Optuna storage
(`sqlite:///...`, `postgresql://...`) holding the config family's studies. For each (GEMM, M) of the new
study, the closest source problem (same dtype first, then the nearest E, N, K on a log scale) at
the nearest recorded M gives its fastest correct configs; those the target's rules admit (shared
memory, TMA, the SGLang releases named) are queued first, after SGLang's own configs. The search
goes on from there as usual: a warm start changes where the study begins, never what it may pick.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from autotune.contract.config import KernelConfig
from autotune.measure.records import Measurement

_KEY = re.compile(r"E=(\d+),N=(\d+),K=(\d+),topk=(\d+),(\w+)")


class WarmStartError(ValueError):
    pass


@dataclass
class WarmStart:
    source: str
    measurements: list      # ok measurements of the family's configs in the source

    def describe(self) -> str:
        problems = sorted({m.problem for m in self.measurements})
        return f"{self.source}: {len(self.measurements)} measurements of {len(problems)} problem(s)"

    def configs(self, problem, gemm: str, M: int, top: int = 3) -> list[KernelConfig]:
        """The source's `top` fastest configs for this GEMM at the M nearest to `M`, from the
        problem closest to `problem`."""
        mine = [m for m in self.measurements if m.gemm == gemm]
        if not mine:
            return []
        best_problem = min({m.problem for m in mine}, key=lambda k: _distance(k, problem))
        at = [m for m in mine if m.problem == best_problem]
        near_M = min({m.M for m in at}, key=lambda x: (abs(math.log(x) - math.log(M)), x))
        out, seen = [], set()
        for m in sorted((m for m in at if m.M == near_M), key=lambda m: m.time_us):
            if m.config not in seen:
                seen.add(m.config)
                out.append(m.config)
            if len(out) == top:
                break
        return out


def fit(config: KernelConfig, space) -> KernelConfig | None:
    """A source config as the target space writes it: itself where the space holds it, else its
    tiles without the features the target has no ladder for (USE_TMA where TMA is unavailable)."""
    idx = space.indices_of(config) or space.indices_of({k: v for k, v in config.items() if k in space.params})
    return space.config_at(idx) if idx is not None else None


def _distance(key: str, problem) -> tuple:
    m = _KEY.fullmatch(key)
    if not m:
        return (2, math.inf)
    E, N, K, _, dtype = int(m[1]), int(m[2]), int(m[3]), int(m[4]), m[5]
    shape = sum(abs(math.log(a) - math.log(b)) for a, b in ((E, problem.E), (N, problem.N), (K, problem.K)))
    return (0 if dtype == problem.dtype else 1, shape)


def load(spec: str, family) -> WarmStart:
    """The source's measurements of `family`'s configs (its GEMMs, its keys: `gemms`, `config_order`);
    WarmStartError (one line) when it has none."""
    if "://" in spec:
        found, families = _from_storage(spec, family)
    else:
        found, families = _from_cache(spec, family)
    ok = [m for m in found if m.ok and m.gemm in family.gemms and any(k in m.config for k in family.config_order)]
    if not ok:
        held = ", ".join(sorted(families)) or "nothing"
        raise WarmStartError(f"--warm-start {spec} holds no {family.name} measurements to start from (it holds "
                             f"{held}); a warm start must come from the same kernel family")
    return WarmStart(spec, ok)


def _from_cache(path: str, family) -> tuple[list[Measurement], set]:
    from autotune.measure.records import CacheError, read_cache

    try:
        cache = read_cache(path)
    except CacheError as e:
        raise WarmStartError(f"--warm-start: {e}") from None
    ms = [*cache.records.values(), *cache.careful.values()]
    return ms, {family.name if m.gemm in family.gemms else f"backend choices ({m.gemm})" for m in ms}


def _from_storage(url: str, family) -> tuple[list[Measurement], set]:
    import optuna

    from autotune.store.storage import ATTR, StorageError, open_storage, safe_url

    try:
        # Read, never created: a missing SQLite file stays missing, a foreign database untouched.
        storage = open_storage(url, existing=True, reads_only=True)
    except StorageError as e:
        # its advice names the flag the storage came from
        raise WarmStartError("--warm-start: " + re.sub(r"(check|name another) --storage", r"\1 --warm-start",
                                                       str(e))) from None
    try:
        summaries = optuna.get_all_study_summaries(storage, include_best_trial=False)
    except Exception as e:
        raise WarmStartError(f"--warm-start {safe_url(url)} unreadable: {type(e).__name__}: "
                             f"{str(e).splitlines()[0] if str(e) else ''}") from None
    ms, families = [], set()
    for s in summaries:
        families.add(s.study_name.split("|", 1)[0])
        if not s.study_name.startswith(family.name + "|"):
            continue
        study = optuna.load_study(study_name=s.study_name, storage=storage)
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
            if ATTR in t.user_attrs:
                ms.append(Measurement.from_dict(t.user_attrs[ATTR]))
        ms.extend(Measurement.from_dict(v) for k, v in study.user_attrs.items() if k.startswith("careful:"))
    return ms, families
