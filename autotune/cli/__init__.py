"""The `autotune` command: main, and run, worker, export and record as calls of the library
(autotune.api); the flags: cli_parser.py; the commands on folders: folder_commands.py, printed by cli_folder.py.

This module imports nothing that takes time: main installs the Ctrl-C and SIGTERM handlers before
the first import that can (the parser's, SGLang's, torch's), so a stop at any moment is one line and
exit 130 or 143 (a Ctrl-C in the first tenth of a second was a traceback from inside an import)."""
from __future__ import annotations

import sys

from autotune import stops
from autotune.cli import textout

EXIT_STOPPED = {"SIGINT": 130, "SIGTERM": 143}
EXIT_OUTPUT_LOST = 4      # cli.common.EXIT_INCOMPLETE (not imported here: this module imports nothing slow)


# --- the commands that measure: a request from the flags, the library call (autotune.api) -------

def cmd_run(args) -> int:
    from autotune import api
    api.run(api.request(api.RunRequest, args))
    return 0


def cmd_worker(args) -> int:
    from autotune import api
    api.worker(api.request(api.WorkerRequest, args))
    return 0


def cmd_export(args) -> int:
    from autotune import api
    api.export(api.request(api.ExportRequest, args))
    return 0


def cmd_record(args) -> int:
    from autotune import api
    api.record(api.request(api.RecordRequest, args))
    return 0


# --- entry point ---------------------------------------------------------------------------------

def build_parser():
    from autotune.cli import parser
    from autotune.cli.folder import commands

    return parser.build_parser({**commands, "run": cmd_run, "worker": cmd_worker, "export": cmd_export,
                                    "record": cmd_record})


def _working_folder_problem() -> str | None:
    """A working folder deleted while the shell was in it: every relative path, and the libraries that
    look up their own files from it (torch's oneMKL: a FATAL ERROR), fail, each its own way."""
    import os

    try:
        os.getcwd()
        return None
    except FileNotFoundError:
        try:
            where = os.readlink("/proc/self/cwd").removesuffix(" (deleted)")
        except OSError:
            where = os.environ.get("PWD", "?")
        return f"the working folder {where} no longer exists (it was deleted): cd into a folder that exists first"


def _environment_problem() -> str | None:
    """The variables every command obeys, read once before any command: AUTOTUNE_GPU_MEMORY (every command that
    touches the GPU) and AUTOTUNE_SQLITE_JOURNAL (every storage opened); one said wrongly is one line."""
    from autotune.gpus.memory_plan import GpuMemoryError, memory_cap
    from autotune.store.storage_url import sqlite_journal

    try:
        memory_cap()
        sqlite_journal()
    except (GpuMemoryError, ValueError) as e:
        return str(e)
    return None


def main(argv=None) -> int:
    """The command line `argv` (None: the process's own, and the process ends after it: a stop from
    then on, in the interpreter's shutdown, ends it at once with the same code)."""
    stops.install()
    textout.plain_fallbacks()          # an output encoding that lacks a character is never a failure
    with textout.kept_streams() as (out, _):      # nor a full, closed or lost stdout or stderr
        try:
            code = _main(argv)
        except KeyboardInterrupt:
            stops.finishing()              # a second stop while this is said: the same exit, at once
            code = _stopped()
        code = _output_lost(out, code)
    if argv is None:
        stops.finishing(code)
    else:
        stops.install()                # an in-process caller goes on: a later stop is its KeyboardInterrupt
    return code


def _stopped() -> int:
    """Say how the command was stopped; its exit code."""
    # CPython remembers a KeyboardInterrupt that ended any code run from a string (dataclasses and
    # namedtuple make their methods so), even one caught here, and `python -m autotune` then dies
    # by SIGINT instead of exiting 130; each such run forgets it first, so one more resets it.
    exec("pass", {})
    import signal

    by = "SIGTERM" if stops.stopped_by() == signal.SIGTERM else "SIGINT"
    if stops.stopped_while_measuring():
        print(f"autotune: stopped by {by}; finished measurements are in the storage, the trials being "
              "measured are marked and re-queued, a re-run resumes", file=sys.stderr)
    else:                  # said by what was running: no trial was being measured, none was re-queued
        print(f"autotune: stopped by {by}; nothing was half-written (each file is as it was or wholly "
              "written, a folder change or a publish is undone whole); the same command starts again",
              file=sys.stderr)
    return EXIT_STOPPED[by]


def _output_lost(out, code: int) -> int:
    """The exit code once stdout failed: a command that went through but whose printed report is lost is
    incomplete (4: its files are written, the report is not); a reader that stopped reading changes nothing."""
    why = textout.lost_output(out)
    if why is None:
        return code
    print(f"autotune: incomplete: what the command printed could not be written to stdout ({why}); the command "
          "went through and what it wrote is kept: only what it printed is lost", file=sys.stderr)
    return EXIT_OUTPUT_LOST if code == 0 else code


def _main(argv) -> int:
    from autotune.cli.common import EXIT_BAD_INPUT, EXIT_INCOMPLETE, EXIT_NOTHING_DONE, EXIT_STORAGE_LOST

    why = _working_folder_problem()       # before the libraries that look for their files from it load
    if why:
        print(f"autotune: error: {why}", file=sys.stderr)
        return EXIT_BAD_INPUT
    from autotune.errors import Incomplete, NothingDone, UsageError, one_line
    from autotune.fileio.writing import FileFormatError, forcing
    from autotune.cli.inputs import BadInput, cache_folders_problem
    from autotune.problems.models import ModelError
    from autotune.store.run_lock import RunLocked
    from autotune.contract.spaces import SpaceError

    try:
        args = build_parser().parse_args(argv)
    except (BadInput, UsageError) as e:          # UsageError: a kernel family's package declares it wrongly
        print(f"autotune: error: {one_line(e)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    why = cache_folders_problem() or _environment_problem()
    if why:
        print(f"autotune: error: {why}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if getattr(args, "log_level", None) == "debug":
        import importlib

        import optuna
        importlib.import_module("autotune.store.storage")    # it quietens Optuna on import: first
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


if __name__ == "__main__":
    sys.exit(main())
