"""What a run checks before it measures, in the order that lets a refusal change nothing (something to
tune, every output ours to write, then the storage opened and claimed), and the --json summary it
writes at its end."""
from __future__ import annotations

from pathlib import Path

from autotune.errors import UsageError
from autotune.run.opening import by_step


def default_scope_note(req) -> list[str]:
    """What the defaults chose, said where the user chose none of it (the default qwen3.5 scope is
    about 1.6 h of Triton measurements alone on an H200)."""
    from autotune.families import registry
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
            "--kernels triton_moe, or bound it with --budget 1h"]


SUMMARY_OURS = ("command", "device")


def outputs_then_storage(req, device, pool, plans, skus, run_name, read_first=None):
    """In this order, so that a refusal changes nothing: something to tune, every output writable
    by us, then the storage opened and claimed. The pool is closed on a refusal."""
    try:
        refuse_nothing_to_tune(plans)
        check_outputs(req, device, plans, skus)
        return open_storage_claimed(req, device, run_name, read_first=read_first)
    except BaseException:
        if pool is not None:
            pool.close()
        raise


def refuse_nothing_to_tune(plans) -> None:
    """A plan with no problem in any family: one line naming why for each (the run and its dry run)."""
    if not any(fp.problems for fp in plans):
        raise UsageError("nothing to tune on this device: " + "; ".join(
            f"{fp.name}: {fp.unsupported or _why_none(fp)}" for fp in plans))


def _why_none(fp) -> str:
    whys = sorted({why for _, why in fp.skipped})
    return "; ".join(whys[:2]) if whys else "no problems"


def check_outputs(req, device, plans, skus=()) -> None:
    """Every file the run will write, checked before anything is measured: a file there that
    autotune did not write is refused (NotOurs, exit 2) unless --force; a folder that holds results
    measured another way is refused."""
    from autotune.export import server_args
    from autotune.families.registry import BACKENDS, CONFIGS
    from autotune.errors import ExportError
    from autotune.fileio.writing import claim, json_with

    steps = by_step(plans)
    try:
        for fp in steps.get(CONFIGS, ()):
            fp.family.export_targets(req.out, device, fp.problems, skus)
        if steps.get(BACKENDS):
            server_args.check_folder(req.out, device)
            from autotune.export.tactics import BLOCKLIST_FILE, CACHE_FILE
            folder = Path(req.out) / device.file_name
            claim(folder / BLOCKLIST_FILE, json_with("invalid_tactics"))
            claim(folder / CACHE_FILE, json_with("_metadata"))
    except (ExportError, server_args.ChoicesError) as e:
        raise UsageError(str(e)) from None
    if getattr(req, "json", None):
        claim(req.json, json_with(*SUMMARY_OURS), "--json")
    check_distinct_files(req, device)


def check_distinct_files(req, device) -> None:
    """The run's single-file outputs name different files, none inside the tuned folder (which the
    export owns) and none under a file: each was said only after measuring, when written."""
    from autotune.fileio.writing import check_writable
    from autotune.run.opening import check_worker_log
    from autotune.store.storage import DEFAULT_STORAGE, StorageError, sqlite_file

    if getattr(req, "worker_log", None):
        check_worker_log(req.worker_log)       # a replay starts no worker, but the flag is still checked
    tuned = (Path(req.out) / device.file_name).resolve() if getattr(req, "out", None) else None
    named = {flag: getattr(req, attr, None) for flag, attr in
             (("--json", "json"), ("--record", "record"), ("--worker-log", "worker_log"))}
    try:
        named["--storage"] = sqlite_file(req.storage or DEFAULT_STORAGE)   # the file SQLite opens
    except StorageError as e:
        raise UsageError(str(e)) from None
    seen = {}
    for flag, path in named.items():
        if not path:
            continue
        where = Path(path).resolve()
        if where in seen:
            raise UsageError(f"{seen[where]} and {flag} name the same file {path}: name one each")
        seen[where] = flag
        if flag != "--storage" and tuned is not None and (where == tuned or tuned in where.parents):
            raise UsageError(f"{flag} {path} is inside the tuned folder {tuned}, which the run writes: "
                             "name a file outside it")
        above = next((p for p in where.parents if p.exists()), None)
        if above is not None and not above.is_dir():
            raise UsageError(f"{flag} {path}: {above} is a file, not a folder")
        if flag != "--storage":         # (the storage's own checks say why SQLite cannot write there)
            try:
                check_writable(where.parent)
            except OSError as e:
                raise UsageError(f"{flag} {path}: {e}") from None


def check_record_file(path) -> None:
    """--record extends a measurement cache; anything else at that path is refused, before any work."""
    from autotune.measure.records import CacheError, read_cache

    if path and Path(path).exists():
        try:
            read_cache(path)
        except CacheError as e:
            raise UsageError(f"--record {path}: {e}; refusing to overwrite it (name a new file)") from None


def check_record_device(path, device) -> None:
    from autotune.measure.records import read_cache

    if path and Path(path).exists():
        rec = read_cache(path).device
        if (rec.get("name"), rec.get("sm")) != (device.name, device.sm):
            raise UsageError(f"--record {path} holds measurements of {rec.get('name')} (SM{rec.get('sm')}), not "
                             f"{device.name}: name a new file")


def run_name(req, device) -> str:
    """Studies are named after the run (default: the GPU's name); replays never share a GPU's."""
    return (getattr(req, "study", None) or device.file_name) + ("~replay" if device.is_replay else "")


def open_storage_claimed(req, device, run_name: str, shared: bool = False, read_first=None):
    """`read_first(storage)`: a command that reads a run (export) checks what it needs there before the
    claim writes anything; the storage and the run must then exist already (nothing is created)."""
    from autotune.store.storage import StorageError, claim, open_storage, target

    existing = read_first is not None
    try:
        storage = open_storage(req.storage, shared=shared, heartbeat_s=getattr(req, "heartbeat", 10),
                               existing=existing)
        if existing:
            read_first(storage)
        claim(storage, run_name, device, existing=existing)
    except StorageError as e:
        raise UsageError(str(e))
    if req.storage and target(req.storage).in_memory:
        print(f"note: --storage {req.storage} is held in memory: nothing measured is kept, a stopped run cannot resume")
    return storage


def write_summary(req, device, summary: dict) -> None:
    if getattr(req, "json", None):
        from autotune.fileio.writing import json_with, write_json
        write_json(req.json, {**summary, "device": device.name, "replay": device.is_replay,
                               "out": str(Path(req.out) / device.file_name)}, ours=json_with(*SUMMARY_OURS))
        print(f"wrote {req.json} (summary of the run)")
