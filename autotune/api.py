"""The library: each command that measures as one call taking a typed request and returning what it
did (the `autotune` command only parses flags into a request, calls here and prints the errors).

    from autotune import api
    result = api.run(api.RunRequest(model="qwen3.5-35b-a3b", tp=(8,), replay="grid.jsonl.gz"))

Bad input raises autotune.errors.UsageError (one line; the command exits 2 with it). A request's
fields are the flags of its command, by the same names, with the same defaults.
"""
from __future__ import annotations

import dataclasses

from autotune.run.requests import (ExportRequest, RecordRequest, RunRequest, RunResult, TuneRequest,  # noqa: F401
                                   WorkerRequest)


def run(req: RunRequest) -> RunResult:
    """Plan every requested family on the device, check every step, then run each and write the files;
    the --json summary last (autotune.run.pipeline)."""
    from autotune.run import pipeline
    return pipeline.run(req)


def worker(req: WorkerRequest) -> None:
    """Search the run's studies together with other workers sharing the storage (autotune.run.shared_study)."""
    from autotune.run import pipeline
    pipeline.worker(req)


def export(req: ExportRequest) -> None:
    """Select and write the files from a shared study (autotune.run.shared_study)."""
    from autotune.run import pipeline
    pipeline.export(req)


def record(req: RecordRequest) -> None:
    """Measure the whole grid into a measurement cache (autotune.run.grid_record)."""
    from autotune.run import pipeline
    pipeline.record(req)


def request(cls, namespace):
    """A request of `cls` from a parsed command line: each field from the flag of the same name."""
    return cls(**{f.name: getattr(namespace, f.name) for f in dataclasses.fields(cls) if hasattr(namespace, f.name)})
