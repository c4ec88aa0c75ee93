"""What a run will do and roughly what it will cost, said before it starts (`run --dry-run` prints
only this, with what it leaves out and what the defaults chose; every run says it first, SayScope).

The cost model is the replay's (autotune.measure.replay): a measurement costs its recorded timing
seconds plus its compile seconds shared by the recording's parallel compilers. Per measurement
the mean comes from the --replay recording, or else from the committed H200 bf16 run (labelled:
another GPU compiles and times at another speed). Measurements per study: the trial budget, each
trial also measured at `neighbours` adjacent batch sizes on each side, plus selection's careful
re-measurements of the top candidates and SGLang's baselines.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from autotune.contract import registry
from autotune.contract.capabilities import runners
from autotune.run.step import Step

REFERENCE = Path(__file__).resolve().parents[2] / "benchmarks/data/h200_run_bf16_2026-12-01.jsonl.gz"
CAREFUL_PER_M = 5 * 2      # top 3 + default + shipped pairs, both GEMMs
# The H200 bf16 run of REFERENCE: 243.7 s of wall time against 121 s of this model for its 4500 planned
# measurements (docs/PERFORMANCE.md): worker start-up, JIT builds and scheduling are not in the recording.
WALL_FACTOR = 2.0
# Backend families: a default and a re-measurement per available backend, ~8 measurements per (problem, M);
# each backend with FlashInfer tactics adds what its runner lists there, known only on the GPU. An H200
# fp8_gemm run (cuBLAS + cuDNN: 544 measurements for 4 shapes x 4 M) averaged ~13 per tunable backend
# per (problem, M).
BACKENDS_PER_M = 8
TACTICS_PER_TUNABLE = 13


@dataclass
class Scope:
    lines: list[str]
    measurements: int
    device_s: float | None
    basis: str


def mean_cost(cache, triton: bool | None = None) -> float:
    """Mean recorded device seconds per ok measurement (`triton`: only the Triton MoE GEMMs' records,
    or only the backend families'; None: all)."""
    parallel = int(cache.notes.get("compile_workers", 15))
    ms = [m for m in cache.records.values() if m.ok and (triton is None or (m.gemm != "layer") == triton)]
    return sum(m.bench_s + m.compile_s / parallel for m in ms) / len(ms) if ms else 0.0


def _recorded_gpu(path: Path) -> str | None:
    import gzip
    try:
        from autotune.fileio.reading import parse_json, require_regular
        with gzip.open(require_regular(path), "rt") as f:
            return parse_json(f.readline()).get("device", {}).get("name")
    except (OSError, EOFError, ValueError, AttributeError):
        return None


def cost_basis(triton: bool, device=None, cache=None) -> tuple[float | None, str]:
    """(mean device seconds per measurement of a family kind, where that number comes from): the
    replayed recording, else a committed recording made on this GPU model, else one of another
    GPU (said: the estimate is borrowed)."""
    from autotune.measure.records import CacheError, read_cache

    if cache is not None:
        return (mean_cost(cache, triton) or None), "the replayed recording"
    name = getattr(device, "name", None) or "NVIDIA H200"
    files = [REFERENCE] + sorted(p for p in REFERENCE.parent.glob("*.jsonl.gz") if p != REFERENCE)
    gpus = {p: _recorded_gpu(p) for p in files}
    for own in (True, False):
        for p in files:
            if (gpus[p] == name) != own or gpus[p] is None:
                continue
            try:
                cost = mean_cost(read_cache(p), triton)
            except CacheError:
                continue
            if cost:
                return cost, (f"{p.name}, recorded on {name}" if own else
                              f"{p.name}, borrowed from {gpus[p]}: no {'Triton MoE' if triton else 'backend'} "
                              f"recording of {name} is committed, and another GPU compiles and times at another speed")
    return None, "no recording"


def scope(plans, tps, trials: int, neighbours: int, budget_s: float | None, cache=None, device=None) -> Scope:
    lines, total, device_s, bases = [], 0, 0.0, []
    for fp in plans:
        if fp.unsupported or not fp.problems:
            continue
        configs = registry.get(fp.name).step == registry.CONFIGS
        if configs:
            per = [len(p.batch_sizes) * len(fp.family.gemms) for p in fp.problems]
            n = sum(k * trials * (1 + 2 * neighbours) for k in per) + \
                sum(len(p.batch_sizes) * CAREFUL_PER_M for p in fp.problems)
            counts = sorted({len(p.batch_sizes) for p in fp.problems})
            each = f"{counts[0]} each" if len(counts) == 1 else ", ".join(str(len(p.batch_sizes)) for p in fp.problems)
            line = (f"  {fp.name}: {len(fp.problems)} problems x {len(fp.family.gemms)} GEMMs x batch sizes "
                    f"({each}) = {sum(per)} studies of "
                    f"{trials} trials; ~{n} measurements")
        else:
            tunable = sum(r.tunable and r.name not in fp.family.skip for r in runners(fp.name))
            n = sum(len(p.batch_sizes) for p in fp.problems) * (BACKENDS_PER_M + TACTICS_PER_TUNABLE * tunable)
            tactics = (f", and every tactic FlashInfer's runners list for its {tunable} backend{'s' * (tunable != 1)} with tactics "
                       f"(~{TACTICS_PER_TUNABLE} each per shape and batch size on the H200)" if tunable else "")
            line = (f"  {fp.name}: {len(fp.problems)} problems, every available backend at every batch size"
                    f"{tactics}; ~{n} measurements")
        cost, basis = cost_basis(configs, device, cache)
        if cost is not None and device_s is not None:
            device_s += n * cost
            line += f", {_time(n * cost)}"
            if basis not in bases:
                bases.append(basis)
        else:
            device_s = None
        lines.append(line)
        total += n
    if not total:
        device_s = None
    head = [f"scope: TP {','.join(map(str, tps))}; {total} measurements planned"]
    if device_s is not None:
        head[0] += (f", {_time(device_s)} of recorded compile and timing seconds (from {'; '.join(bases)}; "
                    f"the H200 bf16 run took about {WALL_FACTOR:.0f}x that in wall time)")
        if budget_s is not None and budget_s < device_s:
            head.append(f"  --budget {budget_s:.0f} s stops it before that: the studies get what fits")
        elif budget_s is None and device_s > 3600:
            head.append("  no --budget: this runs until every study has its trials; --budget 1h (say) bounds it, "
                        "--model/--tp/--dtype narrow it")
    return Scope(head + lines, total, device_s, "; ".join(bases))


def _time(s: float) -> str:
    return f"~{s / 60:.0f} min" if s >= 90 else f"~{s:.0f} s"


class SayScope(Step):
    """The scope and the GPU memory plan, said as the run starts (after the pool, before the storage)."""
    needs = ("request", "device", "cache", "plans", "memory")

    def run(self, ctx) -> None:
        for line in scope_lines(ctx):
            print(line)


def scope_lines(ctx) -> list[str]:
    from autotune.problems.selection import selection

    req = ctx.request
    lines = scope(ctx.plans, selection(req).tps, req.trials or 40, req.neighbours, req.budget, ctx.cache,
                  ctx.device).lines
    return lines + (ctx.memory.lines(ctx.device.name) if ctx.memory is not None else [])


def say_dry_run(ctx) -> None:
    """`run --dry-run`: the plan, its scope and what it leaves out, every check of the run's steps passed."""
    from autotune.run.plan import left_out_lines

    device = ctx.device
    print(f"plan for {device.name} (SM{device.sm}, {device.smem_optin} B shared memory)"
          + {"planned": ", named by --target-device: nothing is measured here", "replay": ", the replayed recording's GPU"}
          .get(device.kind, ""))
    for line in [*scope_lines(ctx), *left_out_lines(ctx.plans, unrecorded=False), *default_scope_note(ctx.request)]:
        print(line)


def default_scope_note(req) -> list[str]:
    """What the defaults chose, said where the user chose none of it (the default qwen3.5 scope is
    about 1.6 h of Triton measurements alone on an H200). `req`: a RunRequest."""
    from autotune.problems import models

    said = []
    if not req.model and not req.model_config and not req.only_drifted:
        fam = req.shapes or "qwen3.5"
        said.append(f"the {fam} family ({', '.join(m.name for m in models.select_models(fam))})")
    if tuple(req.tp) == (1, 2, 4, 8):
        said.append("every TP size (1,2,4,8)")
    if not req.dtype:
        said.append("every dtype the GPU supports")
    if req.kernels in (None, "all"):
        said.append(f"every kernel family ({', '.join(registry.names())})")
    if not said:
        return []
    return ["default scope: " + ", ".join(said) + "; narrow it with --tp 8, --model NAME, --dtype bf16 or "
            f"--kernels {registry.default()}, or bound it with --budget 1h"]
