"""The library: each command that measures as one call taking a typed request and returning what it
did (the `autotune` command only parses flags into a request, calls here and prints the errors).

    from autotune import api
    result = api.run(api.RunRequest(model="qwen3.5-35b-a3b", tp=(8,), replay="grid.jsonl.gz"))

Bad input raises autotune.errors.UsageError (one line; the command exits 2 with it). A request's
fields are the flags of its command, by the same names, with the same defaults.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from autotune.families import registry
from autotune.errors import Incomplete, NothingDone, UsageError


@dataclass
class TuneRequest:
    """What the commands that measure share: what to tune, where and how to measure it, the search."""
    # what to tune
    shapes: str | None = None
    model: str | None = None
    model_config: str | None = None
    tp: tuple = (1, 2, 4, 8)
    ep: tuple = (1,)
    dtype: str | None = None
    batch_sizes: tuple | None = None
    search_space: str | None = None
    sglang_version: str | None = None
    # where it is measured
    replay: str | None = None
    replay_realtime: float = 0.0
    gpus: str = "0"
    workers: int | None = None
    routings: int = 10
    seed: int = 0
    skew: float = 0.0
    timeout: float = 300.0
    worker_log: str | None = None
    log_level: str = "info"
    quiet: bool = False
    # the search and where it is stored
    storage: str | None = None
    study: str | None = None
    trials: int | None = None
    neighbours: int = 1
    no_shipped: bool = False
    warm_start: str | None = None
    budget: float | None = None
    # what is written
    out: str | None = None
    device_name: tuple | None = None


@dataclass
class RunRequest(TuneRequest):
    kernels: str = "all"
    mix: str = "decode"
    skip_backends: str | None = None
    checkpoint: str | None = None
    json: str | None = None
    record: str | None = None
    only_drifted: str | None = None
    target_device: str | None = None
    dry_run: bool = False


@dataclass
class RunResult:
    summary: dict = field(default_factory=dict)   # what --json writes (less the device and folder)
    out: str | None = None                        # the folder the files went to (None: nothing written)


@dataclass
class WorkerRequest(TuneRequest):
    heartbeat: float = 10


@dataclass
class ExportRequest(TuneRequest):
    partial: bool = False


@dataclass
class RecordRequest(TuneRequest):
    cache: str = ""
    shard: tuple | None = None


def run(req: RunRequest) -> RunResult:
    """Plan every requested family on the device, check every output, then run each family's step
    (a config search, or the backend choice) and write the files; the --json summary last."""
    from autotune.run import opening, outputs
    from autotune.run.plan import PlanError, parse_kernels
    from autotune.run.common import load_warm_start, new_summary, print_shared, selection
    from autotune.run.config_search import run_configs, sku_names

    if req.target_device and not req.dry_run:
        raise UsageError("--target-device plans a run for a GPU model: it needs --dry-run (a run measures on the "
                         "GPU it finds, or replays --replay)")
    if req.target_device and req.replay:
        raise UsageError("--target-device and --replay both name the device: give one")
    outputs.check_record_file(req.record)
    warm = load_warm_start(req.warm_start)
    try:
        kernels = parse_kernels(req.kernels)
    except PlanError as e:
        raise UsageError(str(e))
    check_for_kernels(req, kernels)
    if req.out is None and req.only_drifted:
        req = dataclasses.replace(req, out=str(Path(req.only_drifted).resolve().parent))   # back where they were
    if req.out is None:
        # Replayed results never land beside configs measured on a GPU.
        req = dataclasses.replace(req, out="tuned_configs/replay" if req.replay else "tuned_configs")
    if not req.dry_run:
        from autotune.fileio.writing import check_writable
        try:
            check_writable(req.out)
        except OSError as e:
            raise UsageError(str(e))
        if req.json and Path(req.json).is_dir():
            raise UsageError(f"--json {req.json} is a folder; name a file")
    device, pool, cache, exp, plans, memory = opening.open_device(req, kernels)
    if req.only_drifted and not any(fp.problems or fp.skipped for fp in plans):
        if pool is not None:
            pool.close()
        print(f"nothing drifted in {req.only_drifted}: every file fits this machine and SGLang "
              f"{', '.join(opening.targets(req))}; nothing to re-tune")
        return RunResult()
    skus = sku_names(req, device)
    outputs.check_record_device(req.record, device)
    from autotune.run.scope import scope
    if req.dry_run:
        if pool is not None:
            pool.close()
        outputs.refuse_nothing_to_tune(plans)
        print(f"plan for {device.name} (SM{device.sm}, {device.smem_optin} B shared memory)"
              + {"planned": ", named by --target-device: nothing is measured here", "replay": ", the replayed recording's GPU"}
              .get(device.kind, ""))
    for line in scope(plans, selection(req)[1], req.trials or 40, req.neighbours, req.budget, cache, device).lines:
        print(line)
    for line in (memory.lines(device.name) if memory is not None else ()):
        print(line)
    if req.dry_run:
        for fp in plans:           # what the run would leave out, as the run says it
            if fp.unsupported:
                print(f"not on this device: {fp.name}: {fp.unsupported}")
            for p, why in ([] if fp.unsupported else fp.skipped):
                print(f"skip {fp.name} {p.key}: {why}")
        for line in outputs.default_scope_note(req):
            print(line)
        return RunResult()
    run_name = outputs.run_name(req, device)
    storage = outputs.outputs_then_storage(req, device, pool, plans, skus, run_name)
    summary = new_summary()
    if memory is not None:
        summary["memory_plan"] = memory.to_dict()
    from autotune.folder.change import folder_change
    from autotune.run.run_lock import run_lock
    from autotune.store.storage import DEFAULT_STORAGE
    with pool, run_lock(storage, req.storage or DEFAULT_STORAGE, run_name), \
            folder_change(Path(req.out) / device.file_name) as change:
        change.begin()
        label = ("REPLAY of a recorded measurement cache (" + req.replay + "), not a live GPU"
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
        if any(registry.get(k).step == registry.CONFIGS for k in kernels):
            print_shared(exp)
        from autotune.search.context import Clock
        clock = Clock(pool)
        steps = opening.by_step(plans)
        configs_written = False
        if steps.get(registry.CONFIGS) and hasattr(pool, "use_phase"):
            pool.use_phase(opening.phase_name(registry.CONFIGS))
        for fp in steps.get(registry.CONFIGS, ()):
            configs_written |= run_configs(req, fp, device, pool, storage, req.budget, clock, run_name, warm, summary)
        if steps.get(registry.CONFIGS) and not configs_written and not steps.get(registry.BACKENDS):
            _raise_incomplete(summary)
            raise NothingDone("no config of " + ", ".join(fp.name for fp in steps[registry.CONFIGS]) + " ran "
                              "correctly at any batch size: nothing written (the lines above say why)")
        if steps.get(registry.BACKENDS):
            from autotune.run.backend_choice import run_backend_choice
            if hasattr(pool, "use_phase"):
                pool.use_phase(opening.phase_name(registry.BACKENDS))
            run_backend_choice(req, steps[registry.BACKENDS], device, pool, storage, run_name, summary)
            if summary.get("backends_chosen") is False and not configs_written:
                raise NothingDone("no backend of " + ", ".join(fp.name for fp in steps[registry.BACKENDS])
                                  + " ran correctly at a measured batch size: nothing written (the tables above "
                                  "say why; --skip-backends may have left out the ones that run)")
        if memory is not None:
            summary["memory_plan"].update(measured_peak_bytes=pool.peak_bytes, resource_retries=pool.resource_retries,
                                          workers_retired=pool.retired)
    if change.outcome:
        print(change.outcome)
        summary.setdefault("incomplete", []).append(change.outcome)
    from autotune.run.common import after_search
    after_search(summary, f"--json {req.json}", outputs.write_summary, req, device, summary)
    _raise_incomplete(summary)
    return RunResult(summary, str(Path(req.out) / device.file_name))


def _raise_incomplete(summary: dict) -> None:
    if summary.get("incomplete"):
        raise Incomplete(f"{len(summary['incomplete'])} step(s) of the run failed or left a batch size without a key "
                         "(the storage holds every measurement; the same command redoes the step without measuring): "
                         + "; ".join(summary["incomplete"]))


def check_for_kernels(req: RunRequest, kernels: list[str]) -> None:
    """The settings of one family need it among the run's kernels: without it they were ignored in
    silence (a search space never read, server_args.yaml naming another family's runner)."""
    from autotune.search.warm_start import FAMILY       # the family a warm start and --only-drifted re-tune

    readers = {"--search-space": [n for n in registry.names() if "space_path" in registry.get(n).options],
               "--warm-start": [FAMILY], "--only-drifted": [FAMILY]}
    for flag, value in (("--search-space", req.search_space), ("--warm-start", req.warm_start),
                        ("--only-drifted", req.only_drifted)):
        if value is not None and not set(readers[flag]) & set(kernels):
            raise UsageError(f"{flag} is read by {', '.join(readers[flag])}, which --kernels {req.kernels} does not "
                             f"run: add it to --kernels or leave {flag} out")
    if req.checkpoint is not None and req.checkpoint not in kernels:
        raise UsageError(f"--checkpoint {req.checkpoint} names a family --kernels {req.kernels} does not run: add it "
                         "to --kernels or leave --checkpoint out")


def worker(req: WorkerRequest) -> None:
    """Search the run's studies together with other workers sharing the storage (autotune.run.shared_study)."""
    from autotune.run.shared_study import search_shared
    search_shared(req)


def export(req: ExportRequest) -> None:
    """Select and write the files from a shared study (autotune.run.shared_study)."""
    from autotune.run.shared_study import export_shared
    export_shared(req)


def record(req: RecordRequest) -> None:
    """Measure the whole grid into a measurement cache (autotune.run.grid_record)."""
    from autotune.run.grid_record import record_grid
    record_grid(req)


def request(cls, namespace):
    """A request of `cls` from a parsed command line: each field from the flag of the same name."""
    return cls(**{f.name: getattr(namespace, f.name) for f in dataclasses.fields(cls) if hasattr(namespace, f.name)})
