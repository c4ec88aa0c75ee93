"""The `autotune` command: run, worker, export and record (the commands that measure), and main
(the flags: cli_parser.py; the commands on folders: cli_folder.py)."""
from __future__ import annotations

import os
import random
import sys
import tempfile
import time
from pathlib import Path

from .cli_common import (EXIT_BAD_INPUT, EXIT_STORAGE_LOST, UsageError, no_bar, print_shared, selection,
                         summary, triton_settings, warm_start)
from . import cli_parser


# --- run -------------------------------------------------------------------------------------

def _open_device(args, kernels=("triton_moe",)):
    """(device, pool, cache or None, plans): the replay cache or the local GPU(s), the plan of
    every requested family on it, and the measuring pool (its first worker warms the JIT builds
    those plans need)."""
    from . import device as devmod
    from .records import CacheError, merge_caches
    from .replay import ReplayPool
    from .tasks import Settings
    from .worker import WorkerPool

    cache = None
    if args.replay:
        names = [p.strip() for p in args.replay.split(",")]
        if not all(names):
            raise UsageError(f"--replay {args.replay!r} has an empty name in its list")
        try:
            cache = merge_caches(names)
        except CacheError as e:
            raise UsageError(str(e))
        pool = ReplayPool(cache, realtime=getattr(args, "replay_realtime", 0.0) or 0.0)
        device = pool.device
    elif getattr(args, "target_device", None):
        try:
            device, gpus = devmod.planned_gpu(args.target_device), [0]
        except devmod.NoDeviceError as e:
            raise UsageError(str(e)) from None
    elif os.environ.get("AUTOTUNE_CPU_INTERPRETER") == "1":
        device, gpus = devmod.cpu_interpreter(), [0]
    else:
        try:
            device = devmod.detect()
        except devmod.NoDeviceError:
            raise UsageError("no GPU visible and no --replay CACHE given: nothing to measure on" +
                             ("; plan for a GPU model with --target-device NAME (e.g. 'NVIDIA H200')"
                              if getattr(args, "dry_run", False) else "")) from None
        gpus = list(range(device.gpu_count)) if args.gpus == "all" else [int(g) for g in args.gpus.split(",")]
        if any(g >= device.gpu_count for g in gpus):
            raise UsageError(f"--gpus {args.gpus}: this machine has {device.gpu_count} GPU(s) (0-{device.gpu_count - 1})")
    if not args.replay and device.kind != "planned":
        from .kernels.triton_moe import tma_supported
        device = devmod.DeviceInfo(**{**device.__dict__, "versions": {**device.versions, "triton_tma": tma_supported()}})
    options = _family_options(args, device)
    exp, plans = _plan(args, device, cache, kernels, options)
    if getattr(args, "dry_run", False):
        pool = None                                  # nothing is measured: no worker processes
    elif not args.replay:
        workers = args.workers or max(1, min((os.cpu_count() or 2) - 1, 15 * len(gpus)))
        settings = Settings(on_cpu=device.kind == "cpu-interpreter", seed=args.seed, skew=args.skew,
                            routings=args.routings, options=options, log_path=_worker_log(args),
                            warmup=[(fp.name, [p.to_dict() for p in fp.problems]) for fp in plans if fp.problems])
        pool = WorkerPool(settings, workers, gpus=gpus, timeout_s=args.timeout)
    return device, pool, cache, exp, plans


def _worker_log(args) -> str | None:
    """Workers' output (compiler dumps, library warnings) goes to a file, named once here;
    --log-level debug leaves it on the terminal."""
    if getattr(args, "log_level", "info") == "debug":
        return None
    path = getattr(args, "worker_log", None) or os.path.join(
        tempfile.gettempdir(), f"autotune-workers-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log")
    if Path(path).is_dir() or not os.access(Path(path).parent if not Path(path).exists() else path, os.W_OK):
        raise UsageError(f"--worker-log {path}: not a writable file")   # said here, not by a dying worker
    print(f"worker output (compiler messages, full errors): {path}")
    return path


def _family_options(args, device) -> dict:
    """family -> what its protocol object is built with: the run settings its registry entry names
    (autotune.families.RUN_OPTIONS)."""
    from . import families

    tuned = str(Path(getattr(args, "out", None) or "tuned_configs") / device.file_name)
    skip = _skipped_backends(getattr(args, "skip_backends", None) or "")
    given = {"space_path": args.search_space, "sglang_versions": _targets(args), "triton_config_dir": tuned}
    return {name: {k: skip.get(name, ()) if k == "skip" else given[k] for k in families.get(name).options}
            for name in families.names()}


def _skipped_backends(text: str) -> dict:
    """family -> backends --skip-backends leaves out there: NAME in every family that has it,
    FAMILY:NAME in that family only (moe_bf16:flashinfer_cutlass keeps the NVFP4 one)."""
    from .backends import runners
    from .families import BACKENDS, names

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


def _plan(args, device, cache, kernels=("triton_moe",), options=None):
    """Per family: the problems to run on this device and the reasons for the ones left out."""
    from . import models
    from .plan import PlanError, build

    try:
        if getattr(args, "only_drifted", None):
            exp, plans = _drifted_plan(args, device, cache, options)
        else:
            chosen, tps, eps, dtypes, bss = selection(args)
            exp, plans = build(list(kernels), chosen, tps, eps, dtypes, bss, device, cache, options)
    except (models.ModelError, PlanError) as e:
        raise UsageError(str(e))
    for fp in plans:
        for p in fp.problems[:1]:
            for g in fp.family.gemms:
                space = fp.family.space(p, g, device)   # a bad search-space file fails here, before any work
                _check_runnable(fp.family, space, p, g, device)
    return exp, plans


def _drifted_plan(args, device, cache, options):
    """--only-drifted FOLDER: the Triton MoE problems of the folder's files that no longer fit this
    machine or the target SGLang releases (autotune check's reasons), each with its batch sizes."""
    from . import models
    from .check import CheckError, file_drift, read_provenance
    from .kernels import get_family
    from .plan import family_plan

    try:
        prov = read_provenance(args.only_drifted)
        drift = file_drift(prov, _targets(args), None if device.is_replay else device)
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
    fam = get_family("triton_moe", **(options or {}).get("triton_moe", {}))
    plan = family_plan("triton_moe", fam, list(problems.values()), device, cache)
    return models.Expansion(plan.problems, {}), [plan]


def _targets(args) -> list[str]:
    from .sglang_versions import VersionError, parse_targets
    try:
        return parse_targets(getattr(args, "sglang_version", None))
    except VersionError as e:
        raise UsageError(str(e)) from None


def _check_runnable(family, space, problem, gemm, device) -> None:
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


def _by_step(plans) -> dict:
    """step (autotune.families) -> the plans with problems it runs, in the order they came."""
    from . import families

    out: dict = {}
    for fp in plans:
        if fp.problems:
            out.setdefault(families.get(fp.name).step, []).append(fp)
    return out


def cmd_run(args) -> int:
    from . import families
    from .cli_triton import run_triton_moe, sku_names
    from .plan import PlanError, parse_kernels

    budget = args.budget            # seconds (autotune.inputs.seconds)
    if args.target_device and not args.dry_run:
        raise UsageError("--target-device plans a run for a GPU model: it needs --dry-run (a run measures on the "
                         "GPU it finds, or replays --replay)")
    if args.target_device and args.replay:
        raise UsageError("--target-device and --replay both name the device: give one")
    _check_record_file(args.record)
    warm_start(args)
    try:
        kernels = parse_kernels(args.kernels)
    except PlanError as e:
        raise UsageError(str(e))
    if args.out is None and args.only_drifted:
        args.out = str(Path(args.only_drifted).resolve().parent)     # the files go back where they were
    if args.out is None:
        # Replayed results never land beside configs measured on a GPU.
        args.out = "tuned_configs/replay" if args.replay else "tuned_configs"
    if not args.dry_run:
        from .fsutil import check_writable
        try:
            check_writable(args.out)
            if args.json:
                if Path(args.json).is_dir():
                    raise OSError(f"--json {args.json} is a folder; name a file")
                check_writable(Path(args.json).parent)
        except OSError as e:
            raise UsageError(str(e))
    device, pool, cache, exp, plans = _open_device(args, kernels)
    if args.only_drifted and not any(fp.problems or fp.skipped for fp in plans):
        if pool is not None:
            pool.close()
        print(f"nothing drifted in {args.only_drifted}: every file fits this machine and SGLang "
              f"{', '.join(_targets(args))}; nothing to re-tune")
        return 0
    skus = sku_names(args, device)
    _check_record_device(args.record, device)
    from .scope import scope
    if args.dry_run:
        print(f"plan for {device.name} (SM{device.sm}, {device.smem_optin} B shared memory)"
              + {"planned": ", named by --target-device: nothing is measured here", "replay": ", the replayed recording's GPU"}
              .get(device.kind, ""))
    for line in scope(plans, selection(args)[1], args.trials or 40, args.neighbours, budget, cache, device).lines:
        print(line)
    if args.dry_run:
        for line in _default_scope_note(args):
            print(line)
        return 0
    run_name = _run_name(args, device)
    storage = _outputs_then_storage(args, device, pool, plans, skus, run_name)
    from .run_lock import run_lock
    from .storage import DEFAULT_STORAGE
    with pool, run_lock(storage, args.storage or DEFAULT_STORAGE, run_name):
        label = ("REPLAY of a recorded measurement cache (" + args.replay + "), not a live GPU"
                 if device.is_replay else f"{device.kind}")
        print(f"device: {device.name} (SM{device.sm}, {device.smem_optin} B smem) - {label}")
        if device.kind == "cpu-interpreter":
            print("warning: Triton CPU interpreter: timings exercise the pipeline and mean nothing about speed")
        for fp in plans:
            if fp.unsupported:
                print(f"not on this device: {fp.name}: {fp.unsupported}")
                continue
            for p, why in fp.skipped:
                print(f"skip {fp.name} {p.key}: {why}")
            for p, lacking in fp.unrecorded:
                print(f"replay: {fp.name} {p.key}: batch sizes {','.join(map(str, lacking))} are not in the "
                      f"recording; tuning {','.join(map(str, p.batch_sizes))}")
        if any(families.get(k).step == families.CONFIGS for k in kernels):
            print_shared(exp)
        from .study import Clock
        clock = Clock(pool)
        dev_name = run_name
        steps = _by_step(plans)
        for fp in steps.get(families.CONFIGS, ()):
            run_triton_moe(args, fp, device, pool, storage, budget, clock, dev_name)
        if steps.get(families.BACKENDS):
            from .cli_backends import run_backend_choice
            run_backend_choice(args, steps[families.BACKENDS], device, pool, storage, dev_name)
    _write_summary(args, device)
    return 0


def _default_scope_note(args) -> list[str]:
    """What the defaults chose, said where the user chose none of it (the default qwen3.5 scope is
    about 1.6 h of Triton measurements alone on an H200)."""
    from . import families, models

    said = []
    if not args.model and not args.model_config and not args.only_drifted:
        fam = args.shapes or "qwen3.5"
        said.append(f"the {fam} family ({', '.join(m.name for m in models.select_models(fam))})")
    if tuple(args.tp) == (1, 2, 4, 8):
        said.append("every TP size (1,2,4,8)")
    if not args.dtype:
        said.append("every dtype the GPU supports")
    if args.kernels in (None, "all"):
        said.append(f"every kernel family ({', '.join(families.names())})")
    if not said:
        return []
    return ["default scope: " + ", ".join(said) + "; narrow it with --tp 8, --model NAME, --dtype bf16 or "
            "--kernels triton_moe, or bound it with --budget 1h"]


SUMMARY_OURS = ("command", "device")


def _outputs_then_storage(args, device, pool, plans, skus, run_name):
    """In this order, so that a refusal changes nothing: something to tune, every output writable
    by us, then the storage opened and claimed. The pool is closed on a refusal."""
    try:
        if not any(fp.problems for fp in plans):
            raise UsageError("nothing to tune on this device: " + "; ".join(
                f"{fp.name}: {fp.unsupported or 'no problems'}" for fp in plans))
        _check_outputs(args, device, plans, skus)
        return _storage(args, device, run_name)
    except BaseException:
        if pool is not None:
            pool.close()
        raise


def _check_outputs(args, device, plans, skus=()) -> None:
    """Every file the run will write, checked before anything is measured: a file there that
    autotune did not write is refused (NotOurs, exit 2) unless --force; a folder that holds results
    measured another way is refused."""
    from .export import server_args
    from .export.sglang import ExportError, export_targets
    from .families import BACKENDS, CONFIGS
    from .fsutil import claim, json_with

    steps = _by_step(plans)
    try:
        for fp in steps.get(CONFIGS, ()):
            export_targets(args.out, device, fp.problems, skus)
        if steps.get(BACKENDS):
            server_args.check_folder(args.out, device)
            from .export.tactics import BLOCKLIST_FILE, CACHE_FILE
            folder = Path(args.out) / device.file_name
            claim(folder / BLOCKLIST_FILE, json_with("invalid_tactics"))
            claim(folder / CACHE_FILE, json_with("_metadata"))
    except (ExportError, server_args.ChoicesError) as e:
        raise UsageError(str(e)) from None
    if getattr(args, "json", None):
        claim(args.json, json_with(*SUMMARY_OURS), "--json")


def _check_record_file(path) -> None:
    """--record extends a measurement cache; anything else at that path is refused, before any work."""
    from .records import CacheError, read_cache

    if path and Path(path).exists():
        try:
            read_cache(path)
        except CacheError as e:
            raise UsageError(f"--record {path}: {e}; refusing to overwrite it (name a new file)") from None


def _check_record_device(path, device) -> None:
    from .records import read_cache

    if path and Path(path).exists():
        rec = read_cache(path).device
        if (rec.get("name"), rec.get("sm")) != (device.name, device.sm):
            raise UsageError(f"--record {path} holds measurements of {rec.get('name')} (SM{rec.get('sm')}), not "
                             f"{device.name}: name a new file")


def _run_name(args, device) -> str:
    """Studies are named after the run (default: the GPU's name); replays never share a GPU's."""
    return (getattr(args, "study", None) or device.file_name) + ("~replay" if device.is_replay else "")


def _storage(args, device, run_name: str, shared: bool = False):
    from .storage import StorageError, claim, open_storage

    try:
        storage = open_storage(args.storage, shared=shared, heartbeat_s=getattr(args, "heartbeat", 10))
        claim(storage, run_name, device)
    except StorageError as e:
        raise UsageError(str(e))
    return storage


def _write_summary(args, device) -> None:
    if getattr(args, "json", None):
        from .fsutil import json_with, write_json
        write_json(args.json, {**summary(args), "device": device.name, "replay": device.is_replay,
                               "out": str(Path(args.out) / device.file_name)}, ours=json_with(*SUMMARY_OURS))
        print(f"wrote {args.json} (summary of the run)")


# --- many workers on one shared study ------------------------------------------------------------

def cmd_worker(args) -> int:
    """Search the run's studies together with any number of other workers (any hosts) sharing
    the storage; stops when every study has its trials. Selection and files: `autotune export`."""
    from tqdm import tqdm

    from .study import Clock, ProblemTuner

    budget = args.budget            # seconds (autotune.inputs.seconds)
    warm_start(args)
    device, pool, cache, exp, plans = _open_device(args, ["triton_moe"])
    run_name = _run_name(args, device)
    with pool:
        fp = plans[0]
        if not fp.problems:          # before the storage is opened: nothing changes in it
            raise UsageError("nothing to tune on this device: " + (fp.unsupported or "no problems"))
        storage = _storage(args, device, run_name, shared=True)
        settings = triton_settings(args, budget)
        clock = Clock(pool)
        for p in fp.problems:
            with tqdm(total=settings.trials * len(p.batch_sizes) * len(fp.family.gemms), unit="trial",
                      desc=p.key, file=sys.stderr, disable=no_bar(args), dynamic_ncols=True) as bar:
                tuner = ProblemTuner(storage, p, fp.family, device, pool, settings, progress=bar, clock=clock,
                                     study_device=run_name)
                tuner.measure_baselines()
                tuner.search()
            print(f"{p.key}: {'complete' if tuner.complete() else 'stopped'}; this worker stored "
                  f"{tuner.stored_trials} trial measurements ({tuner.measured_now} device measurements)")
    return 0


def cmd_export(args) -> int:
    """Select per M (top candidates re-measured on this device or replay) and write the files,
    from a shared study. Refuses a study short of its trials unless --partial."""
    from .cli_triton import overlay, select_and_export, sku_names
    from .study import Clock, ProblemTuner

    if args.out is None:
        args.out = "tuned_configs/replay" if args.replay else "tuned_configs"
    device, pool, cache, exp, plans = _open_device(args, ["triton_moe"])
    skus = sku_names(args, device)
    run_name = _run_name(args, device)
    storage = _outputs_then_storage(args, device, pool, plans, skus, run_name)
    settings = triton_settings(args, None)
    clock = Clock(pool)
    with pool:
        for p in plans[0].problems:
            t0 = time.monotonic()
            tuner = ProblemTuner(storage, p, plans[0].family, device, pool, settings, clock=clock,
                                 study_device=run_name)
            if not tuner.complete() and not args.partial:
                done = sum(min(s.asked, settings.trials) for s in tuner.slots.values())
                raise UsageError(f"{p.key}: study is partial ({done} of {settings.trials * len(tuner.slots)} "
                                 f"trials); nothing exported (--partial exports it anyway)")
            tuner.measure_baselines()
            select_and_export(args, tuner, device, clock, t0)
        overlay(args, device, plans[0].family)
    return 0


# --- record: measure a whole grid into a cache ---------------------------------------------------

def cmd_record(args) -> int:
    from tqdm import tqdm

    from .kernels import get_family
    from .records import Cache, CacheError, read_cache, write_cache
    from .tasks import Task, run_tasks

    budget = args.budget
    if args.replay:
        raise UsageError("record measures on a GPU; --replay makes no sense here")
    try:                     # the cache it extends is read before any worker starts
        old = read_cache(args.cache) if Path(args.cache).exists() else None
    except CacheError as e:
        raise UsageError(f"--cache {e}; refusing to overwrite it (name a new file)") from None
    device, pool, _, _, plans = _open_device(args)
    family = get_family("triton_moe", space_path=args.search_space)
    cache = old or Cache(device.to_dict())
    cache.device = device.to_dict()
    cache.notes["compile_workers"] = len(pool.slots)
    shard, nshard = args.shard or (0, 1)
    problems = plans[0].problems
    with pool:
        for p, why in plans[0].skipped:
            print(f"skip {p.key}: {why}")
        tasks, base_configs = [], []
        for p in problems:
            cache.problems[p.key] = p.to_dict()
            configs = {g: [] for g in family.gemms}
            for M in p.batch_sizes:
                for pair in family.baselines(p, M, device).values():
                    for g, c in pair.items():
                        if c not in configs[g]:
                            configs[g].append(c)
                            base_configs.append(c)
            for g in family.gemms:
                grid = [c for c in family.space(p, g, device).configs() if family.check(c, p, g, device) is None]
                configs[g] += [c for i, c in enumerate(grid) if i % nshard == shard and c not in configs[g]]
                for c in configs[g]:
                    Ms = [M for M in p.batch_sizes if cache.get(p.key, g, M, c) is None]
                    if Ms:
                        tasks.append(Task(p.to_dict(), p.key, g, c, Ms))
        # Random order: a recording cut short by --budget is a uniform sample of the grid, and a
        # later call (same --cache) measures the rest. Baselines go first.
        tasks.sort(key=lambda t: 0 if any(t.config == b for b in base_configs) else 1)
        n_base = sum(1 for t in tasks if any(t.config == b for b in base_configs))
        rest = tasks[n_base:]
        random.Random(args.seed).shuffle(rest)
        tasks = tasks[:n_base] + rest
        print(f"record: {len(tasks)} configs to measure on {device.name} with {len(pool.slots)} workers"
              + (f", budget {budget:.0f} s" if budget else ""))
        t0 = time.monotonic()
        last_write = [t0]
        with tqdm(total=len(tasks), unit="config", file=sys.stderr, disable=no_bar(args), dynamic_ncols=True) as bar:
            def landed(task, ms):
                for m in ms:
                    cache.add(m)
                bar.update(1)
                if time.monotonic() - last_write[0] > 60:   # a killed call keeps what it measured
                    write_cache(args.cache, cache)
                    last_write[0] = time.monotonic()
            queue = run_tasks(pool, tasks, landed,
                              stop=lambda: budget is not None and time.monotonic() - t0 > budget)
    write_cache(args.cache, cache)
    n_ok = sum(1 for m in cache.records.values() if m.ok)
    print(f"record: {len(cache.records)} measurements ({n_ok} ok) in {args.cache}; "
          f"{len(queue)} configs left for a later call; {time.monotonic() - t0:.0f} s")
    return 0


# --- entry point ---------------------------------------------------------------------------------

def build_parser():
    from .cli_folder import (cmd_check, cmd_compile_limits, cmd_install, cmd_merge, cmd_merge_choices,
                             cmd_publish, cmd_rank_model, cmd_shapes)

    return cli_parser.build_parser({
        "shapes": cmd_shapes, "run": cmd_run, "worker": cmd_worker, "export": cmd_export, "publish": cmd_publish,
        "record": cmd_record, "merge-caches": cmd_merge, "merge-choices": cmd_merge_choices,
        "compile-limits": cmd_compile_limits, "check": cmd_check, "install": cmd_install,
        "rank-model": cmd_rank_model})


def main(argv=None) -> int:
    from .fsutil import FileFormatError, forcing
    from .models import ModelError
    from .run_lock import RunLocked
    from .spaces import SpaceError

    from .inputs import BadInput, one_line

    try:
        args = build_parser().parse_args(argv)
    except BadInput as e:
        print(f"autotune: error: {one_line(e)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    stop = _on_sigterm_interrupt()
    if getattr(args, "log_level", None) == "debug":
        import importlib

        import optuna
        importlib.import_module("autotune.study")    # it quietens Optuna on import: first
        optuna.logging.set_verbosity(optuna.logging.INFO)
    try:
        with forcing(getattr(args, "force", False)):
            return args.fn(args)
    except (UsageError, ModelError, SpaceError, FileFormatError, RunLocked) as e:
        print(f"autotune: error: {one_line(e)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception as e:
        import optuna
        import sqlalchemy.exc

        if not isinstance(e, (sqlalchemy.exc.SQLAlchemyError, optuna.exceptions.StorageInternalError)):
            raise
        print(f"autotune: error: storage lost mid-run ({type(e).__name__}: {str(e).splitlines()[0]}); "
              "measurements told before are kept, nothing was exported for the unfinished problem",
              file=sys.stderr)
        return EXIT_STORAGE_LOST
    except KeyboardInterrupt:
        by = "SIGTERM" if stop.get("signal") else "SIGINT"
        print(f"autotune: stopped by {by}; finished measurements are in the storage, the trials being "
              "measured are marked and re-queued, a re-run resumes", file=sys.stderr)
        return 143 if stop.get("signal") else 130


def _on_sigterm_interrupt() -> dict:
    """`docker stop` sends SIGTERM: stop exactly as on Ctrl-C (storage writes are transactions,
    the trials being measured are re-queued), then exit 143 as a process killed by it would."""
    import signal

    seen: dict = {}

    def handler(signum, frame):
        seen["signal"] = signum
        signal.signal(signal.SIGTERM, signal.SIG_DFL)   # a second SIGTERM ends it at once
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)
    return seen


if __name__ == "__main__":
    sys.exit(main())
