"""The commands that measure are lists of steps over one context (autotune.run.pipeline): every step's
check runs before any step runs, so an input refused by any step's check starts no worker and writes
nothing; and no step reaches back into the pipeline that calls it."""
from __future__ import annotations

import pytest

from autotune.cli import main
from tests.test_layers import PACKAGE, read_graph
from tests.test_reliability import _run, _snapshot, _without, _write

# id -> (the flags a step's check refuses, what the one line says); each step's (or sink's) own check
REFUSED = {
    "summary: --json not ours": (lambda t: ["--json", _write(t / "notes.json", "my notes\n")],
                                 "is not a file autotune wrote"),
    "record: --record not a cache": (lambda t: ["--record", _write(t / "notes.txt", "my notes\n")],
                                     "refusing to overwrite it"),
    "tuned folder: --out under a file": (lambda t: ["--out", str(_write_path(t / "f") / "out")], "is a file"),
    "tuned folder: --record is the storage": (lambda t: ["--record", str(t / "a.db")], "name the same file"),
    "config search: --device-name unusable": (lambda t: ["--device-name", "a/b"], "--device-name"),
}


def _write_path(path):
    _write(path, "x")
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
    argv = [*_without(_run(tmp_path, replay=False), *extra[::2]), *extra]
    before = _snapshot(tmp_path)
    rc = main(argv)
    out, err = capsys.readouterr()
    assert rc == 2 and says in err and len(err.strip().splitlines()) == 1, err
    assert started == [] and "worker output" not in out
    assert _snapshot(tmp_path) == before and not (tmp_path / "out").exists()


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
