"""The `autotune` command: main, and run, worker, export and record as calls of the library
(autotune.api); the flags: cli_parser.py; the commands on folders: folder_commands.py, printed by cli_folder.py."""
from __future__ import annotations

import sys

from . import api, cli_parser
from .cli_common import EXIT_BAD_INPUT, EXIT_INCOMPLETE, EXIT_NOTHING_DONE, EXIT_STORAGE_LOST
from .errors import Incomplete, NothingDone, UsageError


# --- the commands that measure: a request from the flags, the library call (autotune.api) -------

def cmd_run(args) -> int:
    api.run(api.request(api.RunRequest, args))
    return 0


def cmd_worker(args) -> int:
    api.worker(api.request(api.WorkerRequest, args))
    return 0


def cmd_export(args) -> int:
    api.export(api.request(api.ExportRequest, args))
    return 0


def cmd_record(args) -> int:
    api.record(api.request(api.RecordRequest, args))
    return 0


# --- entry point ---------------------------------------------------------------------------------

def build_parser():
    from .cli_folder import commands

    return cli_parser.build_parser({**commands, "run": cmd_run, "worker": cmd_worker, "export": cmd_export,
                                    "record": cmd_record})


def _memory_cap_problem() -> str | None:
    """AUTOTUNE_GPU_MEMORY read once, before any command: every command that touches the GPU obeys it."""
    from .gpu_memory import GpuMemoryError, memory_cap

    try:
        memory_cap()
    except GpuMemoryError as e:
        return str(e)
    return None


def main(argv=None) -> int:
    from .fsutil import FileFormatError, forcing
    from .models import ModelError
    from .run_lock import RunLocked
    from .spaces import SpaceError

    from .inputs import BadInput, cache_folders_problem, one_line

    try:
        args = build_parser().parse_args(argv)
    except BadInput as e:
        print(f"autotune: error: {one_line(e)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    why = cache_folders_problem() or _memory_cap_problem()
    if why:
        print(f"autotune: error: {why}", file=sys.stderr)
        return EXIT_BAD_INPUT
    from . import stops

    stops.install()
    if getattr(args, "log_level", None) == "debug":
        import importlib

        import optuna
        importlib.import_module("autotune.storage")    # it quietens Optuna on import: first
        optuna.logging.set_verbosity(optuna.logging.INFO)
    try:
        with forcing(getattr(args, "force", False)):
            return args.fn(args)
    except (UsageError, ModelError, SpaceError, FileFormatError, RunLocked) as e:
        print(f"autotune: error: {one_line(e)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except NothingDone as e:
        print(f"autotune: {one_line(e)}", file=sys.stderr)
        return EXIT_NOTHING_DONE
    except Incomplete as e:
        print(f"autotune: incomplete: {one_line(e)}", file=sys.stderr)
        return EXIT_INCOMPLETE
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
        import signal

        by = "SIGTERM" if stops.stopped_by() == signal.SIGTERM else "SIGINT"
        print(f"autotune: stopped by {by}; finished measurements are in the storage, the trials being "
              "measured are marked and re-queued, a re-run resumes", file=sys.stderr)
        return 143 if by == "SIGTERM" else 130


if __name__ == "__main__":
    sys.exit(main())
