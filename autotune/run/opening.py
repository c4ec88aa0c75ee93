"""What a command opens before its steps check anything: the device it measures on (a GPU, the CPU
interpreter, a replayed recording or a planned GPU), the plan of every requested family there and the
GPU memory plan, into the context (autotune.run.context). Nothing here writes or starts a process: the
measuring pool is a step's (autotune.run.workers)."""
from __future__ import annotations

import os

from autotune.errors import UsageError
from autotune.contract import registry
from autotune.problems.selection import selection
from autotune.run.plan import by_step, phase_name

from autotune.gpus.memory_plan import WORKERS_PER_GPU

# The context's fields the opening fills, before any step runs (autotune.run.step.check_order); a replay's pool
# too, which the Workers step then holds as it holds a pool it starts.
PROVIDES = ("device", "cache", "gpus", "options", "expansion", "plans", "memory", "run_name")


def open_device(ctx, kernels=None, target=None, drifted=None, skip=None) -> None:
    """The replay cache or the local GPU(s), the plan of every requested family on it and the GPU memory
    plan, into `ctx` (a replay's pool too: the recording is its device). `target`: a GPU model planned for
    (--target-device); `drifted`: a tuned folder whose drifted files are the problems (--only-drifted);
    `skip`: --skip-backends; `kernels`: the families to plan (None: the registry's default config family)."""
    from autotune.adapters import local_gpu
    from autotune.gpus import device as devmod
    from autotune.measure.records import CacheError, merge_caches
    from autotune.measure.replay import ReplayPool

    req, cache, gpus = ctx.request, None, []
    if req.replay:
        names = [p.strip() for p in req.replay.split(",")]
        if not all(names):
            raise UsageError(f"--replay {req.replay!r} has an empty name in its list")
        try:
            cache = merge_caches(names)
        except CacheError as e:
            raise UsageError(str(e))
        ctx.pool = ReplayPool(cache, realtime=req.replay_realtime or 0.0)
        device = ctx.pool.device
    elif target:
        try:
            device, gpus = devmod.planned_gpu(target), [0]
        except devmod.NoDeviceError as e:
            raise UsageError(str(e)) from None
    elif os.environ.get("AUTOTUNE_CPU_INTERPRETER") == "1":
        device, gpus = devmod.cpu_interpreter(), [0]
    else:
        try:
            device = local_gpu.detect()
        except devmod.NoDeviceError:
            raise UsageError("no GPU visible and no --replay CACHE given: nothing to measure on" +
                             ("; plan for a GPU model with --target-device NAME (e.g. 'NVIDIA H200')"
                              if ctx.plan_only else "")) from None
        gpus = list(range(device.gpu_count)) if req.gpus == "all" else [int(g) for g in req.gpus.split(",")]
        if any(g >= device.gpu_count for g in gpus):
            raise UsageError(f"--gpus {req.gpus}: this machine has {device.gpu_count} GPU(s) (0-{device.gpu_count - 1})")
    if not req.replay and device.kind != "planned":
        device = devmod.DeviceInfo(**{**device.__dict__, "versions": {**device.versions,
                                                                       "triton_tma": local_gpu.triton_has_tma()}})
    ctx.device, ctx.cache, ctx.gpus = device, cache, gpus
    ctx.options = family_options(req, device, skip)
    ctx.expansion, ctx.plans = plan_families(ctx, kernels, drifted)
    if not req.replay and req.workers and req.workers > WORKERS_PER_GPU * len(gpus):
        raise UsageError(f"--workers {req.workers}: at most {WORKERS_PER_GPU} a GPU "
                         f"({WORKERS_PER_GPU * len(gpus)} for --gpus {req.gpus})")
    ctx.memory = memory_plan(req, device, gpus, ctx.plans) if not req.replay else None
    ctx.run_name = run_name(req, device)


REPLAY_RUN = "~replay"      # ends every replay's run name: a replay never shares a GPU's studies


def run_name(req, device) -> str:
    """Studies are named after the run (default: the GPU's name); replays never share a GPU's. A replay's
    --study may be given with its REPLAY_RUN end (as a refusal names the run), a GPU's may not."""
    base = req.study or device.file_name
    if device.is_replay:
        return base if base.endswith(REPLAY_RUN) else base + REPLAY_RUN
    if base.endswith(REPLAY_RUN):
        raise UsageError(f"--study {base} names a replay's run ({REPLAY_RUN}): a run on a GPU never shares a "
                         f"replay's studies; name it without {REPLAY_RUN}")
    return base


def memory_plan(req, device, gpus: list[int], plans):
    """The GPU memory plan (autotune.gpus.memory_plan) of a GPU here or a catalog GPU planned for; None on the
    CPU. A problem one worker (with the run's own layer check) cannot hold is left out, with why."""
    from autotune.contract import registry
    from autotune.gpus import memory_plan as gm
    from autotune.gpus.catalog import find

    if device.kind not in ("gpu", "planned"):
        return None
    try:
        cap = gm.memory_cap()
    except gm.GpuMemoryError as e:
        raise UsageError(str(e)) from None
    if device.kind == "planned":
        gpu = find(device.name)
        mems = [gm.GpuMemory(0, gpu.memory_bytes, gpu.memory_bytes, cap)]
    else:
        mems = gm.read_gpus(gpus, cap)
    phases = []
    for step, fps in by_step(plans).items():
        workers, mains = [], []
        for fp in fps:
            layer_check = step == registry.CONFIGS and device.kind in ("gpu", "planned") \
                and hasattr(fp.family, "main_footprint")
            kept = []
            for p in fp.problems:
                own = footprint(fp.family, p, device, req.routings)
                main = fp.family.main_footprint(p, device) if layer_check else None
                why = gm.too_big(own, main, mems)
                if why:
                    fp.skipped.append((p, why))
                    continue
                kept.append(p)
                workers.append(own)
                mains.append(main)
            fp.problems = kept
        if workers:
            apart = device.kind in ("gpu", "planned") and all(getattr(fp.family, "compiles_apart", False) for fp in fps)
            phases.append(gm.Phase(phase_name(step), gm.largest(workers), gm.largest(mains), apart))
    if not phases:
        return None
    try:
        return gm.plan_pool(mems, phases, cores=os.cpu_count() if device.kind == "gpu" else None,
                            requested=req.workers, builders=req.builders)
    except gm.GpuMemoryError as e:
        raise UsageError(str(e)) from None


def footprint(family, problem, device, routings: int):
    """A family's predicted footprint, or a stated guess where it predicts none (a family plugged in
    without one)."""
    from autotune.gpus.memory_plan import GiB, Footprint

    fn = getattr(family, "footprint", None)
    return fn(problem, device, routings) if fn is not None else Footprint(
        f"{family.name} {problem.key} (not predicted by its family: 4 GiB assumed)", {"assumed": 4 * GiB})


def family_options(req, device, skip: str | None = None) -> dict:
    """family -> what its protocol object is built with: the run settings its registry entry names
    (autotune.contract.registry.RUN_OPTIONS); `skip`: --skip-backends."""
    from autotune.contract import registry

    from autotune.folder.tuned import TunedFolder

    tuned = str(TunedFolder.under(req.out or "tuned_configs", device).given)
    skip = skipped_backends(skip or "")
    given = {"space_path": req.search_space, "sglang_versions": targets(req), "triton_config_dir": tuned}
    return {name: {k: skip.get(name, ()) if k == "skip" else given[k] for k in registry.get(name).options}
            for name in registry.names()}


def skipped_backends(text: str) -> dict:
    """family -> backends --skip-backends leaves out there: NAME in every family that has it,
    FAMILY:NAME in that family only (moe_bf16:flashinfer_cutlass keeps the NVFP4 one)."""
    from autotune.contract.capabilities import runners
    from autotune.contract.registry import BACKENDS, names

    FAMILIES = names(BACKENDS)
    out: dict = {f: [] for f in FAMILIES}
    for entry in (e.strip() for e in text.split(",") if e.strip()):
        family, _, name = entry.rpartition(":")
        if family and family not in FAMILIES:
            raise UsageError(f"--skip-backends {entry!r}: unknown family {family!r}; known: {', '.join(FAMILIES)}")
        known = sorted({b.name for b in runners(family or None)})
        if name not in known:
            raise UsageError(f"--skip-backends: unknown backend {name!r}" + (f" for {family}" if family else "")
                             + f"; known: {', '.join(known)}")
        for f in ([family] if family else FAMILIES):
            if name in {b.name for b in runners(f)}:
                out[f].append(name)
    return {f: tuple(v) for f, v in out.items()}


def plan_families(ctx, kernels=None, drifted=None):
    """Per family: the problems to run on this device and the reasons for the ones left out;
    `drifted`: the tuned folder whose drifted files are the problems."""
    from autotune.problems import models
    from autotune.run.plan import PlanError, build

    device = ctx.device
    try:
        if drifted:
            exp, plans = drifted_plan(ctx, drifted)
        else:
            exp, plans = build(list(kernels or [registry.default()]), selection(ctx.request), device, ctx.cache,
                               ctx.options)
    except (models.ModelError, PlanError) as e:
        raise UsageError(str(e))
    for fp in plans:
        for p in fp.problems[:1]:
            for g in fp.family.gemms:
                space = fp.family.space(p, g, device)   # a bad search-space file fails here, before any work
                check_runnable(fp.family, space, p, g, device)
    return exp, plans


def drifted_plan(ctx, folder):
    """--only-drifted FOLDER: the Triton MoE problems of the folder's files that no longer fit this
    machine or the target SGLang releases (autotune check's reasons), each with its batch sizes."""
    from autotune.problems import models
    from autotune.folder.check import CheckError, file_drift
    from autotune.folder.tuned import TunedFolder
    from autotune.contract.protocol import get_family
    from autotune.run.plan import family_plan

    device = ctx.device
    try:
        prov = TunedFolder(folder).recorded()
        drift = file_drift(prov, targets(ctx.request), None if device.is_replay else device)
    except CheckError as e:
        raise UsageError(f"--only-drifted: {e}") from None
    problems = {}
    for name, why in drift.items():
        print(f"{'drifted' if why else 'fresh'}: {name}" + (f": {'; '.join(why)}" if why else ""))
        if why:
            try:
                p = models.problem_from_dict(prov["files"][name]["problem"])
            except (KeyError, TypeError, ValueError):
                raise UsageError(f"--only-drifted: provenance.json's {name} has no readable problem") from None
            problems.setdefault(p.key, p)
    name = registry.default()
    fam = get_family(name, **ctx.options.get(name, {}))
    plan = family_plan(name, fam, list(problems.values()), device, ctx.cache)
    return models.Expansion(plan.problems, {}), [plan]


def targets(req) -> list[str]:
    from autotune.adapters.sglang_versions import VersionError, parse_targets
    try:
        return parse_targets(req.sglang_version)
    except VersionError as e:
        raise UsageError(str(e)) from None


def check_runnable(family, space, problem, gemm, device) -> None:
    """A search space none of whose configs this device can run is bad input, not an empty result."""
    first = None
    for config in space.configs():
        why = family.check(config, problem, gemm, device)
        if why is None:
            return
        first = first or why
    if first is not None:
        where = getattr(family, "space_path", None) or "the search space"
        raise UsageError(f"{where}: no {gemm} config of it runs on {device.name} for {problem.key} "
                         f"(all {space.size()} rejected before compiling, e.g. {first})")
