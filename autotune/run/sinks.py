"""Where the steps' side outputs go, as TVM MetaSchedule's measure callbacks: the --json summary, the
--record measurement cache, progress bars and the report tables. The context carries one of each
(`Sinks`); a step calls them and never the writers, so what a command leaves beside its files is
decided in one place. Each sink with a file checks it with the steps (`check(ctx)`, changing nothing)."""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from autotune.errors import Incomplete, UsageError

SUMMARY_OURS = ("command", "device")
# What a recording's header vouches for beside the GPU model: its rows were measured with these versions.
RECORD_STACK = ("triton", "sglang")


class Summary:
    """What the run did, for --json: filled by the steps, written once at the end (`path` None: kept
    in memory, returned by the library call)."""

    def __init__(self, path: str | None = None):
        self.path = path
        self.data: dict = {"command": "autotune " + " ".join(sys.argv[1:])}

    def add(self, name: str, entry: dict) -> None:
        """One problem's entry under its family's (or another list's) name."""
        self.data.setdefault(name, []).append(entry)

    def incomplete(self, line: str) -> None:
        """A step that failed or left a batch size without a key: the command then exits 4."""
        self.data.setdefault("incomplete", []).append(line)

    @property
    def failures(self) -> list[str]:
        return self.data.get("incomplete", [])

    def incomplete_error(self) -> Incomplete:
        return Incomplete(f"{len(self.failures)} step(s) of the run failed or left a batch size without a key (the "
                          "storage holds every measurement; the same command redoes the step without measuring): "
                          + "; ".join(self.failures))

    def check(self, ctx) -> None:
        """--json names a file autotune may write (not a folder, ours if it exists)."""
        if self.path is None or ctx.plan_only:
            return
        if Path(self.path).is_dir():
            raise UsageError(f"--json {self.path} is a folder; name a file")
        from autotune.fileio.writing import claim, json_with
        claim(self.path, json_with(*SUMMARY_OURS), "--json")

    def write(self, ctx) -> None:
        if self.path is None:
            return
        from autotune.fileio.writing import json_with, write_json
        write_json(self.path, {**self.data, "device": ctx.device.name, "replay": ctx.device.is_replay,
                               "out": str(ctx.folder.given)}, ours=json_with(*SUMMARY_OURS))
        print(f"wrote {self.path} (summary of the run)")


class Record:
    """--record: every measurement a step makes, added to a measurement cache (what a replay answers
    from). Without a path it keeps nothing."""

    def __init__(self, path: str | None = None):
        self.path = path

    def check(self, ctx) -> None:
        """The file is absent, or a measurement cache of this device and stack (the GPU model, Triton and
        SGLang the run measures with: one header vouches for every row) that can be replaced; anything
        else is refused before anything is measured."""
        from autotune.fileio.writing import change_problem
        from autotune.measure.records import CacheError, read_cache

        if not self.path or not Path(self.path).exists():
            return
        try:
            rec = read_cache(self.path).device
        except CacheError as e:
            raise UsageError(f"--record {self.path}: {e}; refusing to overwrite it (name a new file)") from None
        if (rec.get("name"), rec.get("sm")) != (ctx.device.name, ctx.device.sm):
            raise UsageError(f"--record {self.path} holds measurements of {rec.get('name')} (SM{rec.get('sm')}), "
                             f"not {ctx.device.name}: name a new file")
        for k in RECORD_STACK:
            was, now = (rec.get("versions") or {}).get(k), ctx.device.versions.get(k)
            if was != now:
                raise UsageError(f"--record {self.path} holds measurements made with {k} {was}, this run measures "
                                 f"with {k} {now}: one header vouches for every row of a recording; name a new file")
        why = change_problem(self.path)
        if why:
            raise UsageError(f"--record {self.path} {why}: the run would add its measurements to it; make it "
                             "writable or name a new file")

    def add(self, device, problem, measurements, careful=()) -> None:
        if not self.path:
            return
        from autotune.measure.records import Cache, CacheError, read_cache, write_cache

        try:
            cache = read_cache(self.path)
        except CacheError:
            cache = Cache(device.to_dict())
        cache.problems[problem.key] = problem.to_dict()
        for ms, is_careful in ((measurements, False), (careful, True)):
            for m in ms:
                if m.status != "invalid":
                    cache.add(m, careful=is_careful)
        write_cache(self.path, cache)


class Progress:
    """Progress bars on stderr, only on a terminal: in a log file they are thousands of carriage
    returns. The one-line summary after each problem is printed either way."""

    def __init__(self, quiet: bool = False):
        self.quiet = quiet

    def bar(self, total: int, unit: str, desc: str | None = None):
        from tqdm import tqdm
        return tqdm(total=total, unit=unit, desc=desc, file=sys.stderr, disable=self.quiet or not sys.stderr.isatty(),
                    dynamic_ncols=True)


class Report:
    """The tables for people (autotune.run.report), printed as they come."""

    def table(self, df, head: str | None = None) -> None:
        from autotune.run.report import format_table
        print(format_table(df) if head is None else f"{head}\n{format_table(df)}")


@dataclass
class Sinks:
    summary: Summary
    record: Record
    progress: Progress
    report: Report

    @classmethod
    def of(cls, req, json: str | None = None, record: str | None = None) -> "Sinks":
        """A command's sinks: the summary and the record where it has those flags (`run`)."""
        return cls(Summary(json), Record(record), Progress(req.quiet or req.log_level == "warning"), Report())

    def check(self, ctx) -> None:
        self.record.check(ctx)
        self.summary.check(ctx)


def after_search(summary: Summary, what: str, fn, *args, let_through=(), writes=None, **kwargs):
    """A step after the search (the layer check, writing files, --record, the summary): where it fails
    the run says so in one line, notes it in the summary's "incomplete" list (the run then exits 4) and
    goes on; what was measured is in the storage, so the same command does the step again without
    measuring. Returns fn's result, None where it failed; `let_through`: exceptions the caller handles;
    `writes`: the tuned folder (autotune.folder.tuned.TunedFolder) the step writes into, whose change is then
    thrown away whole (a folder changes as one), and whose staged paths the line names as the user's."""
    import logging

    try:
        return fn(*args, **kwargs)
    except let_through:
        raise
    except Exception as e:
        from autotune.errors import one_line

        logging.getLogger("autotune").debug("%s failed", what, exc_info=True)
        line = f"{what} failed: {type(e).__name__}: {one_line(e)}"
        line = writes.in_words(line) if writes is not None else line
        print(f"  {line}; nothing measured is lost (the storage holds it): the same command does it again "
              "without measuring", flush=True)
        summary.incomplete(line)
        if writes is not None:
            writes.fail(line)
        return None
