"""Where a command's results go: the tuned folder under --out, changed as one (autotune.folder.change),
and the single-file outputs beside it (--json, --record, --worker-log, the SQLite storage), checked to
name different files outside the folder before anything is measured."""
from __future__ import annotations

from pathlib import Path

from autotune.errors import UsageError
from autotune.run.context import Step


class TunedFolder(Step):
    """Checks that the folder can be written and that no single-file output names it, another output or
    a path under a file; runs by taking the folder's one-writer lock and staging its change."""

    def check(self, ctx) -> None:
        if ctx.plan_only:
            return
        from autotune.fileio.writing import check_writable, tree_problem
        from autotune.folder.provenance import nested_problem

        why = nested_problem(ctx.request.out)
        if why:
            raise UsageError(why)
        try:
            check_writable(ctx.request.out)
        except OSError as e:
            raise UsageError(str(e))
        why = tree_problem(ctx.tuned_folder())      # staged beside it, swapped in by a rename: all of it changes
        if why:
            raise UsageError(f"output folder {ctx.tuned_folder()} cannot be changed: {why}; nothing measured "
                             "(make it writable, or name another --out)")
        check_distinct_files(ctx)

    def run(self, ctx) -> None:
        from autotune.folder.change import folder_change

        ctx.change = ctx.held.enter_context(folder_change(ctx.tuned_folder()))
        ctx.change.begin()


def check_distinct_files(ctx) -> None:
    """The command's single-file outputs name different files, none inside the tuned folder (which the
    export owns) and none under a file: each was said only after measuring, when written."""
    from autotune.fileio.writing import check_writable
    from autotune.run.workers import check_worker_log
    from autotune.store.storage import DEFAULT_STORAGE, StorageError, sqlite_file

    req = ctx.request
    if req.worker_log:
        check_worker_log(req.worker_log)       # a replay starts no worker, but the flag is still checked
    tuned = ctx.tuned_folder().resolve()
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
