"""Where a command's results go: the tuned folder under --out, one handle (autotune.folder.tuned.TunedFolder)
changed as one, and the single-file outputs beside it (--json, --record, --worker-log, the SQLite storage),
checked to name different files outside the folder before anything is measured."""
from __future__ import annotations

from pathlib import Path

from autotune.errors import UsageError
from autotune.run.step import Step


class HoldFolder(Step):
    """Its check opens the tuned folder's handle on the context (its paths and the --device-name SKU names its
    files are also written under: nothing on disk) and checks that the folder can be written and that no
    single-file output names it, another output or a path under a file; it runs by taking the folder's
    one-writer lock and staging its change."""
    needs = ("request", "device", "sinks", "plan_only", "held")
    provides = ("folder",)

    def check(self, ctx) -> None:
        from autotune.folder.tuned import TunedFolder

        ctx.folder = TunedFolder.under(ctx.request.out, ctx.device, sku_names(ctx))
        if ctx.plan_only:
            return
        from autotune.fileio.writing import check_writable, tree_problem
        from autotune.folder.tuned import nested_problem

        why = nested_problem(ctx.request.out)
        if why:
            raise UsageError(why)
        try:
            check_writable(ctx.request.out)
        except OSError as e:
            raise UsageError(str(e))
        why = tree_problem(ctx.folder.given)      # staged beside it, swapped in by a rename: all of it changes
        if why:
            raise UsageError(f"output folder {ctx.folder.given} cannot be changed: {why}; nothing measured "
                             "(make it writable, or name another --out)")
        check_distinct_files(ctx)

    def run(self, ctx) -> None:
        ctx.held.enter_context(ctx.folder.held())
        ctx.folder.begin()


def sku_names(ctx) -> tuple[str, ...]:
    """--device-name values, checked before anything is measured."""
    from autotune.export.skus import SkuError, check_name
    from autotune.gpus.catalog import same_product

    device, names = ctx.device, []
    for raw in ctx.request.device_name or ():
        try:
            name = check_name(raw)
        except SkuError as e:
            raise UsageError(str(e)) from None
        if same_product(device.name, name) is False:
            raise UsageError(f"--device-name {name!r} is another chip than {device.name!r}: its configs must be "
                             "measured there")
        if name.replace(" ", "_") in (n.replace(" ", "_") for n in names):   # one file name: written twice
            raise UsageError(f"--device-name {name!r} is given twice; each SKU is written once")
        names.append(name)
    return tuple(names)


def check_distinct_files(ctx) -> None:
    """The command's single-file outputs name different files, none inside the tuned folder (which the
    export owns) and none under a file: each was said only after measuring, when written."""
    from autotune.fileio.writing import check_writable
    from autotune.run.workers import check_worker_log
    from autotune.store.storage import DEFAULT_STORAGE, StorageError, sqlite_file

    req = ctx.request
    if req.worker_log:
        check_worker_log(req.worker_log)       # a replay starts no worker, but the flag is still checked
    tuned = ctx.folder.given.resolve()
    named = {"--json": ctx.sinks.summary.path, "--record": ctx.sinks.record.path, "--worker-log": req.worker_log}
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
        if flag != "--storage" and (where == tuned or tuned in where.parents):
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
