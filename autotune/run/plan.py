"""Which problems each requested kernel family tunes on this device, and why others are left out.

Families (autotune.contract.registry): the config searches (SGLang's fused-MoE configs per shape and M), the
MoE runner choice for bf16 / fp8-block / NVFP4 experts, and the dense GEMM backend choice, each found where it
is declared. Each one's problems are the kind its class declares (the fused-MoE layers or the dense GEMMs) at
its dtype. A family that cannot run here is reported once,
with why.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from autotune.errors import UsageError
from autotune.contract import registry
from autotune.problems import models
from autotune.problems.selection import Selection
from autotune.run.step import Step


class PlanError(ValueError):
    pass


@dataclass
class FamilyPlan:
    name: str
    family: object
    problems: list = field(default_factory=list)
    skipped: list = field(default_factory=list)     # (problem, why)
    unrecorded: list = field(default_factory=list)  # (problem, batch sizes the replay lacks), tuned without them
    unsupported: str | None = None                  # the whole family cannot run here


def parse_kernels(text: str | None) -> list[str]:
    """The families --kernels names, each once; `all` (alone) or no flag: every family."""
    known = registry.names()
    if text is None or text.strip() == "all":
        return list(known)
    names = [k.strip() for k in text.split(",") if k.strip()]
    if not names:
        raise PlanError(f"--kernels names no kernel family (got {text!r}); known: {', '.join(known)}, all")
    if "all" in names:
        raise PlanError(f"--kernels {text!r}: 'all' is every family, on its own; name families or all")
    bad = [k for k in names if k not in known]
    if bad:
        raise PlanError(f"unknown kernel family {', '.join(map(repr, bad))}; known: {', '.join(known)}, all")
    twice = sorted({k for k in names if names.count(k) > 1})
    if twice:
        raise PlanError(f"--kernels lists {', '.join(twice)} twice; each family is tuned once")
    return names


def build(kernels: list[str], chosen: Selection, device, cache=None,
          options: dict | None = None) -> tuple[models.Expansion, list[FamilyPlan]]:
    """Plans per family. `chosen.dtypes` filters the dtypes of the families that take --dtype (None: all
    of SGLang's Triton fused MoE); the fused-MoE problems at those dtypes are returned beside the plans."""
    from autotune.contract.protocol import get_family

    options = options or {}
    chosen_models, tps, eps, dtypes, batch_sizes = chosen
    recorded = recorded_batch_sizes(cache)
    triton = models.expand(chosen_models, tps, eps, dtypes or models.TRITON_DTYPES, batch_sizes)
    plans = []
    for name in kernels:
        fam, spec = get_family(name, **options.get(name, {})), registry.get(name)
        if spec.problems == registry.MOE:
            problems = (models.expand(chosen_models, tps, eps, (spec.dtype,), batch_sizes).problems if spec.dtype
                        else triton.problems)
        else:
            problems = [g for m in chosen_models for tp in tps
                        for g in models.dense_gemms(m, tp, spec.dtype, batch_sizes)]
            problems = list({p.key: p for p in problems}.values())
        plans.append(family_plan(name, fam, problems, device, cache, recorded,
                                 recorded_Ms=batch_sizes == models.DEFAULT_BATCH_SIZES))
    return triton, plans


def recorded_batch_sizes(cache) -> dict:
    """(problem key, GEMM) -> the batch sizes a replay cache holds (empty without a cache)."""
    out: dict = {}
    for m in (cache.records.values() if cache is not None else ()):
        out.setdefault((m.problem, m.gemm), set()).add(m.M)
    return out


def family_plan(name: str, fam, problems, device, cache=None, recorded: dict | None = None,
                recorded_Ms: bool = False) -> FamilyPlan:
    """Which of `problems` the family tunes here, each with the batch sizes it can have; why not
    the others. `recorded_Ms`: a replay's problems take the batch sizes of its recording."""
    recorded = recorded_batch_sizes(cache) if recorded is None else recorded
    plan = FamilyPlan(name, fam)
    for p in problems:
        why = fam.unsupported_reason(p, device)
        if why is None and cache is not None:
            rec = cache.problems.get(p.key)
            if rec is None or not any((p.key, g) in recorded for g in fam.gemms):
                why = "not in the replay cache"
            else:
                if recorded_Ms:
                    p = models.problem_from_dict({**rec, "sources": [list(s) for s in p.sources]})
                # A replay answers only what was recorded: say once which batch sizes it lacks
                # and tune the others, rather than fail every trial at those M.
                have = set.intersection(*(recorded.get((p.key, g), set()) for g in fam.gemms))
                lacking = tuple(M for M in p.batch_sizes if M not in have)
                if len(lacking) == len(p.batch_sizes):
                    why = (f"the replay recorded none of batch sizes {_ints(lacking)} "
                           f"(it has {_ints(sorted(have))})")
                elif lacking:
                    p = dataclasses.replace(p, batch_sizes=tuple(M for M in p.batch_sizes if M in have))
                    plan.unrecorded.append((p, lacking))
        (plan.skipped.append((p, why)) if why else plan.problems.append(p))
    if not plan.problems and plan.skipped:
        reasons = {why for _, why in plan.skipped}
        plan.unsupported = reasons.pop() if len(reasons) == 1 else "; ".join(sorted(reasons))
    return plan


def _ints(values) -> str:
    return ",".join(str(v) for v in values)


def by_step(plans) -> dict:
    """step (autotune.contract.registry) -> the plans with problems it runs, in the order they came."""
    out: dict = {}
    for fp in plans:
        if fp.problems:
            out.setdefault(registry.get(fp.name).step, []).append(fp)
    return out


def phase_name(step) -> str:
    """The memory plan's phase of a step (autotune.contract.registry): the pool's limits change between them."""
    return {registry.CONFIGS: "Triton configs", registry.BACKENDS: "backend choice"}[step]


def refuse_nothing_to_tune(plans) -> None:
    """A plan with no problem in any family: one line naming why for each (the run and its dry run)."""
    if not any(fp.problems for fp in plans):
        raise UsageError("nothing to tune on this device: " + "; ".join(
            f"{fp.name}: {fp.unsupported or _why_none(fp)}" for fp in plans))


def _why_none(fp) -> str:
    whys = sorted({why for _, why in fp.skipped})
    return "; ".join(whys[:2]) if whys else "no problems"


def left_out_lines(plans, unrecorded: bool = True) -> list[str]:
    """The families this device cannot run and the problems left out, each with why; `unrecorded`: and
    the batch sizes a replay lacks, tuned without them."""
    lines = []
    for fp in plans:
        if fp.unsupported:
            lines.append(f"not on this device: {fp.name}: {fp.unsupported}")
            continue
        lines += [f"skip {fp.name} {p.key}: {why}" for p, why in fp.skipped]
        lines += [f"replay: {fp.name} {p.key}: batch sizes {','.join(map(str, lacking))} are not in the recording; "
                  f"tuning {','.join(map(str, p.batch_sizes))}" for p, lacking in (fp.unrecorded if unrecorded else ())]
    return lines


class SayPlan(Step):
    """The run's first words once it holds its storage and folder: the device, what is left out and
    why, and the problems that share one SGLang file. Its check: something to tune."""
    needs = ("request", "device", "kernels", "expansion", "plans")

    def check(self, ctx) -> None:
        refuse_nothing_to_tune(ctx.plans)

    def run(self, ctx) -> None:
        from autotune.problems.selection import shared_notes

        device = ctx.device
        label = ("REPLAY of a recorded measurement cache (" + ctx.request.replay + "), not a live GPU"
                 if device.is_replay else f"{device.kind}")
        print(f"device: {device.name} (SM{device.sm}, {device.smem_optin} B smem) - {label}")
        if device.kind == "cpu-interpreter":
            print("warning: Triton CPU interpreter: timings exercise the pipeline and mean nothing about speed")
        for line in left_out_lines(ctx.plans):
            print(line)
        if any(registry.get(k).step == registry.CONFIGS for k in ctx.kernels):
            for line in shared_notes(ctx.expansion):
                print(line)
