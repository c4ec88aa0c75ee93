"""The commands that measure are lists of steps over one context (autotune.run.pipeline): every step's
check runs before any step runs, so an input refused by any step's check starts no worker and writes
nothing; and no step reaches back into the pipeline that calls it."""
from __future__ import annotations

import pytest

from autotune.cli import main
from tests.fakes.command_lines import small_run, without, write_file
from tests.fakes.import_graph import PACKAGE, read_graph
from tests.fakes.tuned_folders import file_hashes

# id -> (the flags a step's check refuses, what the one line says); each step's (or sink's) own check
REFUSED = {
    "summary: --json not ours": (lambda t: ["--json", write_file(t / "notes.json", "my notes\n")],
                                 "is not a file autotune wrote"),
    "record: --record not a cache": (lambda t: ["--record", write_file(t / "notes.txt", "my notes\n")],
                                     "refusing to overwrite it"),
    "tuned folder: --out under a file": (lambda t: ["--out", str(_write_path(t / "f") / "out")], "is a file"),
    "tuned folder: --record is the storage": (lambda t: ["--record", str(t / "a.db")], "name the same file"),
    "config search: --device-name unusable": (lambda t: ["--device-name", "a/b"], "--device-name"),
}


def _write_path(path):
    write_file(path, "x")
    return path


@pytest.mark.parametrize("case", REFUSED)
def test_a_refused_check_starts_no_worker_and_changes_nothing(tmp_path, monkeypatch, capsys, case):
    """On the CPU interpreter (a real measuring pool without a GPU): a check of the last steps used to
    run after the pool was started; now no step runs before every check passed."""
    from autotune.measure import pool

    started = []
    monkeypatch.setattr(pool.WorkerPool, "__init__", lambda self, *a, **k: started.append(a))
    monkeypatch.setenv("AUTOTUNE_CPU_INTERPRETER", "1")
    flags, says = REFUSED[case]
    extra = flags(tmp_path)
    argv = [*without(small_run(tmp_path, replay=False), *extra[::2]), *extra]
    before = file_hashes(tmp_path)
    rc = main(argv)
    out, err = capsys.readouterr()
    assert rc == 2 and says in err and len(err.strip().splitlines()) == 1, err
    assert started == [] and "worker output" not in out
    assert file_hashes(tmp_path) == before and not (tmp_path / "out").exists()


def test_no_step_imports_the_pipeline_or_the_opening():
    """A step gets what it needs from the context; the modules that build it are above every step."""
    edges, _ = read_graph(PACKAGE)
    above = {"autotune.run.pipeline", "autotune.run.opening", "autotune.api"}
    steps = [m for m in edges if m.startswith("autotune.run.") and m not in above]
    assert len(steps) >= 10
    assert {m: sorted(edges[m] & above) for m in steps if edges[m] & above} == {}
    assert "autotune.run.pipeline" in edges["autotune.api"]


def test_run_names_no_family():
    """The steps loop over a family's hooks (autotune.contract.protocol): no module of run/ names a family, nor
    a key or a GEMM of one (the fused MoE's body lives in its package, behind its hooks)."""
    import re

    words = re.compile(r"triton_moe|BLOCK_SIZE\w*|gate_up")
    found = {str(p.relative_to(PACKAGE.parent)): sorted(set(words.findall(p.read_text())))
             for p in sorted((PACKAGE / "run").glob("*.py"))}
    assert len(found) >= 10
    assert {p: words for p, words in found.items() if words} == {}


def _run_argv(t) -> list:
    """A replay run of both kinds of family step (a config search, a backend choice), one batch size, 2 trials."""
    from tests.conftest import GRID, ROOT

    return ["run", "--model", "qwen3.5-397b-a17b", "--tp", "8", "--dtype", "bf16", "--kernels", "triton_moe,moe_bf16",
            "--quiet", "--trials", "2", "--batch-sizes", "8", "--replay",
            f"{GRID},{ROOT / 'benchmarks/data/h200_backends_2026-12-01.jsonl.gz'}", "--out", str(t / "out"),
            "--storage", f"sqlite:///{t / 'a.db'}"]


def test_a_step_moved_before_what_it_needs_is_refused_before_any_step_runs(tmp_path, monkeypatch, capsys):
    """`autotune run` with its run lock moved before the storage is claimed: one line naming both steps, exit 2,
    no step's check or run called and nothing written (without the order check the lock took a storage of None
    halfway through the run)."""
    from autotune.run import pipeline
    from autotune.run.claim import ClaimStorage, RunLock

    wrong = [s for s in pipeline.run_steps() if not isinstance(s, RunLock)]
    wrong.insert(next(i for i, s in enumerate(wrong) if isinstance(s, ClaimStorage)), RunLock())
    monkeypatch.setattr(pipeline, "run_steps", lambda: wrong)
    called = []
    for cls in {type(s) for s in wrong}:
        for name in ("check", "run"):
            monkeypatch.setattr(cls, name, lambda self, ctx, name=name: called.append((type(self).__name__, name)))
    before = file_hashes(tmp_path)
    rc = main(_run_argv(tmp_path))
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert "RunLock needs storage" in err[0] and "ClaimStorage does, after it" in err[0], err
    assert called == [] and file_hashes(tmp_path) == before and not (tmp_path / "out").exists()


def test_the_commands_steps_are_in_an_order_that_gives_each_what_it_needs():
    """Every command's list of steps passes the order check; each step's needs and provides name RunContext
    fields; every field is filled by the command, the opening or a step that says it provides it."""
    import dataclasses

    from autotune.run import opening, pipeline
    from autotune.run.claim import ClaimStorage
    from autotune.run.context import COMMAND, RunContext
    from autotune.run.grid_record import RecordGrid
    from autotune.run.outputs import HoldFolder
    from autotune.run.shared_study import ExportStudy, SharedSearch
    from autotune.run.step import Step, check_order
    from autotune.run.workers import Workers

    given = (*COMMAND, *opening.PROVIDES)
    ctx = RunContext()
    commands = {"run": [*pipeline.run_steps(), *pipeline.family_steps(ctx, _Req())],
                "worker": [Workers(), ClaimStorage(), SharedSearch()],
                "export": [Workers(), HoldFolder(), ClaimStorage(), ExportStudy()],
                "record": [Workers(), RecordGrid("c.jsonl.gz")]}
    for steps in commands.values():
        check_order(steps, given)
    fields = {f.name for f in dataclasses.fields(RunContext)}
    classes = _subclasses(Step)
    assert len(classes) >= 10
    declared = {c.__name__: set(c.needs) | set(c.provides) for c in classes}
    assert {name: sorted(words - fields) for name, words in declared.items() if words - fields} == {}
    assert set(given) <= fields
    filled = set(given).union(*(c.provides for c in classes))
    assert sorted(fields - filled) == []


class _Req:
    mix, checkpoint = "decode", None


def _subclasses(cls) -> list:
    return [s for c in cls.__subclasses__() for s in (c, *_subclasses(c))]


def test_each_step_reads_and_fills_only_the_context_fields_it_declares(tmp_path, monkeypatch):
    """A replay `run` (a config search and a backend choice), a `worker` and an `export` on a context that notes
    which step reads or sets which field: a step reads only what it needs or provides, and sets only what it
    provides (what it declares is what it does: the order check means something); a step's check reads only what
    the command, the opening or an earlier step's check fills (every check runs before any step runs)."""
    import dataclasses

    from autotune.run import backend_choice, config_search, context, grid_record, opening, pipeline, scope, shared_study
    from autotune.run.step import Step
    from tests.conftest import GRID

    del backend_choice, config_search, grid_record, scope, shared_study     # every step's class, to watch

    fields = {f.name for f in dataclasses.fields(context.RunContext)}
    current, seen = [], {}

    class Watched(context.RunContext):
        def __getattribute__(self, name):
            if name in fields and current:
                seen.setdefault(current[-1][0], set()).add(("read", name, current[-1][1]))
            return super().__getattribute__(name)

        def __setattr__(self, name, value):
            if name in fields and current:
                seen.setdefault(current[-1][0], set()).add(("set", name, current[-1][1]))
            super().__setattr__(name, value)

    def watched(cls, method):
        def call(self, ctx):
            current.append((cls, method.__name__))
            try:
                return method(self, ctx)
            finally:
                current.pop()
        return call

    for cls in _subclasses(Step):
        for name in ("check", "run"):
            if name in vars(cls):
                monkeypatch.setattr(cls, name, watched(cls, vars(cls)[name]))
    monkeypatch.setattr(pipeline, "RunContext", Watched)
    problem = ["--model", "qwen3.5-397b-a17b", "--tp", "8", "--dtype", "bf16", "--replay", str(GRID),
               "--batch-sizes", "8", "--trials", "2", "--storage", f"sqlite:///{tmp_path / 'w.db'}"]
    assert main(_run_argv(tmp_path)) == 0
    assert main(["worker", *problem]) == 0
    assert main(["export", *problem, "--out", str(tmp_path / "exported"), "--quiet"]) == 0
    assert {c.__name__ for c in seen} >= {"Workers", "HoldFolder", "ClaimStorage", "RunLock", "SayPlan", "SayScope",
                                          "ConfigSearch", "BackendChoice", "SharedSearch", "ExportStudy"}
    undeclared = {cls.__name__: sorted(f"{how} {name}" for how, name, _ in used
                                       if name not in (cls.provides if how == "set" else {*cls.needs, *cls.provides}))
                  for cls, used in seen.items()}
    assert {name: used for name, used in undeclared.items() if used} == {}
    in_checks = {how: {name for used in seen.values() for h, name, phase in used if (h, phase) == (how, "check")}
                 for how in ("read", "set")}
    assert sorted(in_checks["read"] - {*context.COMMAND, *opening.PROVIDES} - in_checks["set"]) == []
