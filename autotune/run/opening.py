"""A run's first step: the device it measures on (a GPU, the CPU interpreter, a replayed recording
or a planned GPU), the plan of every requested family there, and the measuring pool."""
from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from autotune.errors import UsageError
from autotune.run.common import selection

from autotune.gpus.memory_plan import WORKERS_PER_GPU


def open_device(req, kernels=None):
    """(device, pool, cache or None, expansion, plans, memory plan or None): the replay cache or the local
    GPU(s), the plan of every requested family on it, the GPU memory plan, and the measuring pool sized
    by it (its first worker warms the JIT builds those plans need). `kernels`: the families to plan (None: the
    registry's default config family)."""
    from autotune.adapters import local_gpu
    from autotune.gpus import device as devmod
    from autotune.measure.records import CacheError, merge_caches
    from autotune.measure.replay import ReplayPool
    from autotune.measure.tasks import Settings
    from autotune.measure.pool import WorkerPool

    cache = None
    if req.replay:
        names = [p.strip() for p in req.replay.split(",")]
        if not all(names):
            raise UsageError(f"--replay {req.replay!r} has an empty name in its list")
        try:
            cache = merge_caches(names)
        except CacheError as e:
            raise UsageError(str(e))
        pool = ReplayPool(cache, realtime=getattr(req, "replay_realtime", 0.0) or 0.0)
        device = pool.device
    elif getattr(req, "target_device", None):
        try:
            device, gpus = devmod.planned_gpu(req.target_device), [0]
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
                              if getattr(req, "dry_run", False) else "")) from None
        gpus = list(range(device.gpu_count)) if req.gpus == "all" else [int(g) for g in req.gpus.split(",")]
        if any(g >= device.gpu_count for g in gpus):
            raise UsageError(f"--gpus {req.gpus}: this machine has {device.gpu_count} GPU(s) (0-{device.gpu_count - 1})")
    if not req.replay and device.kind != "planned":
        from autotune.families.triton_moe.tma import tma_supported
        device = devmod.DeviceInfo(**{**device.__dict__, "versions": {**device.versions, "triton_tma": tma_supported()}})
    options = family_options(req, device)
    exp, plans = plan_families(req, device, cache, kernels, options)
    if not req.replay and req.workers and req.workers > WORKERS_PER_GPU * len(gpus):
        raise UsageError(f"--workers {req.workers}: at most {WORKERS_PER_GPU} a GPU "
                         f"({WORKERS_PER_GPU * len(gpus)} for --gpus {req.gpus})")
    memory = memory_plan(req, device, gpus, plans) if not req.replay else None
    if getattr(req, "dry_run", False):
        pool = None                                  # nothing is measured: no worker processes
    elif not req.replay:
        if memory is not None:
            slots, limits = memory.slots(memory.phases[0]), memory.limits(memory.phases[0])
        else:                                        # the CPU interpreter: host memory, not planned
            slots, limits = gpus, {}
            slots = slots[:1] * (req.workers or max(1, min((os.cpu_count() or 2) - 1, WORKERS_PER_GPU)))
        settings = Settings(on_cpu=device.kind == "cpu-interpreter", seed=req.seed, skew=req.skew,
                            routings=req.routings, options=options, log_path=worker_log(req), memory_limits=limits,
                            warmup=[(fp.name, [p.to_dict() for p in fp.problems]) for fp in plans if fp.problems])
        pool = WorkerPool(settings, len(slots), gpus=slots, timeout_s=req.timeout, memory_plan=memory)
    return device, pool, cache, exp, plans, memory


def memory_plan(req, device, gpus: list[int], plans):
    """The GPU memory plan (autotune.gpus.memory_plan) of a GPU here or a catalog GPU planned for; None on the
    CPU. A problem one worker (with the run's own layer check) cannot hold is left out, with why."""
    from autotune.families import registry
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
            phases.append(gm.Phase(phase_name(step), gm.largest(workers), gm.largest(mains)))
    if not phases:
        return None
    try:
        return gm.plan_pool(mems, phases, cores=os.cpu_count() if device.kind == "gpu" else None,
                            requested=req.workers)
    except gm.GpuMemoryError as e:
        raise UsageError(str(e)) from None


def phase_name(step) -> str:
    """The memory plan's phase of a step (autotune.families.registry): the pool's limits change between them."""
    from autotune.families import registry

    return {registry.CONFIGS: "Triton configs", registry.BACKENDS: "backend choice"}[step]


def footprint(family, problem, device, routings: int):
    """A family's predicted footprint, or a stated guess where it predicts none (a family plugged in
    without one)."""
    from autotune.gpus.memory_plan import GiB, Footprint

    fn = getattr(family, "footprint", None)
    return fn(problem, device, routings) if fn is not None else Footprint(
        f"{family.name} {problem.key} (not predicted by its family: 4 GiB assumed)", {"assumed": 4 * GiB})


def worker_log(req) -> str | None:
    """Workers' output (compiler dumps, library warnings) goes to a file, named once here;
    --log-level debug leaves it on the terminal."""
    if getattr(req, "log_level", "info") == "debug":
        return None
    path = getattr(req, "worker_log", None) or os.path.join(
        tempfile.gettempdir(), f"autotune-workers-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log")
    check_worker_log(path)
    if not Path(path).exists():
        Path(path).write_text(LOG_HEADER + time.strftime("%Y-%m-%d %H:%M:%S") + "\n")
    print(f"worker output (compiler messages, full errors): {path}")
    return path


# The first line of a worker log: workers append to a log that starts with it, never to a user's file.
LOG_HEADER = "# autotune worker log, started "


def check_worker_log(path: str) -> None:
    """Said here, before any work, not by a dying worker: a folder, an unwritable place, or a file
    that is not one of our logs (unless --force)."""
    from autotune.fileio.writing import claim, text_starting

    p = Path(path)
    if p.is_dir() or not os.access(p.parent if not p.exists() else p, os.W_OK):
        raise UsageError(f"--worker-log {path}: not a writable file")
    claim(p, text_starting(LOG_HEADER), "--worker-log")


def family_options(req, device) -> dict:
    """family -> what its protocol object is built with: the run settings its declaration names
    (autotune.families.registry.RUN_OPTIONS)."""
    from autotune.families import registry

    tuned = str(Path(getattr(req, "out", None) or "tuned_configs") / device.file_name)
    skip = skipped_backends(getattr(req, "skip_backends", None) or "")
    given = {"space_path": req.search_space, "sglang_versions": targets(req), "triton_config_dir": tuned}
    return {name: {k: skip.get(name, ()) if k == "skip" else given[k] for k in registry.get(name).options}
            for name in registry.names()}


def skipped_backends(text: str) -> dict:
    """family -> backends --skip-backends leaves out there: NAME in every family that has it,
    FAMILY:NAME in that family only (moe_bf16:flashinfer_cutlass keeps the NVFP4 one)."""
    from autotune.families.capabilities import runners
    from autotune.families.registry import BACKENDS, names

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


def plan_families(req, device, cache, kernels=None, options=None):
    """Per family: the problems to run on this device and the reasons for the ones left out."""
    from autotune.families import registry
    from autotune.problems import models
    from autotune.run.plan import PlanError, build

    try:
        if getattr(req, "only_drifted", None):
            exp, plans = drifted_plan(req, device, cache, options)
        else:
            chosen, tps, eps, dtypes, bss = selection(req)
            exp, plans = build(list(kernels or [registry.default()]), chosen, tps, eps, dtypes, bss, device, cache,
                               options)
    except (models.ModelError, PlanError) as e:
        raise UsageError(str(e))
    for fp in plans:
        for p in fp.problems[:1]:
            for g in fp.family.gemms:
                space = fp.family.space(p, g, device)   # a bad search-space file fails here, before any work
                check_runnable(fp.family, space, p, g, device)
    return exp, plans


def drifted_plan(req, device, cache, options):
    """--only-drifted FOLDER: the problems of the folder's config files (the default config family's) that no
    longer fit this machine or the target SGLang releases (autotune check's reasons), each with its batch sizes."""
    from autotune.families import registry
    from autotune.problems import models
    from autotune.folder.check import CheckError, file_drift, read_provenance
    from autotune.families.protocol import get_family
    from autotune.run.plan import family_plan

    try:
        prov = read_provenance(req.only_drifted)
        drift = file_drift(prov, targets(req), None if device.is_replay else device)
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
    fam = get_family(name, **(options or {}).get(name, {}))
    plan = family_plan(name, fam, list(problems.values()), device, cache)
    return models.Expansion(plan.problems, {}), [plan]


def targets(req) -> list[str]:
    from autotune.adapters.sglang_versions import VersionError, parse_targets
    try:
        return parse_targets(getattr(req, "sglang_version", None))
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


def by_step(plans) -> dict:
    """step (autotune.families.registry) -> the plans with problems it runs, in the order they came."""
    from autotune.families import registry

    out: dict = {}
    for fp in plans:
        if fp.problems:
            out.setdefault(registry.get(fp.name).step, []).append(fp)
    return out
