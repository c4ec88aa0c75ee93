"""Reliability of shared and resumed studies (replay device, real PostgreSQL, real SQLite).

PostgreSQL comes from Debian's package, started by .ci/run (scripts/start-postgres.sh), which
exports AUTOTUNE_TEST_POSTGRES; without it these tests skip, unless AUTOTUNE_REQUIRE_POSTGRES=1
(CI) makes that a failure.
"""
import contextlib
import functools
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid

import optuna
import pytest

from tests.conftest import GRID, ROOT, wait_for_trials

pytestmark = pytest.mark.slow      # subprocess runs and workers, PostgreSQL, kill/resume

PG = os.environ.get("AUTOTUNE_TEST_POSTGRES")
if not PG and os.environ.get("AUTOTUNE_REQUIRE_POSTGRES") == "1":
    raise RuntimeError("AUTOTUNE_REQUIRE_POSTGRES=1 but AUTOTUNE_TEST_POSTGRES is not set")
needs_pg = pytest.mark.skipif(not PG, reason="no PostgreSQL (run scripts/start-postgres.sh)")

PROBLEM = ["--model", "qwen3.5-397b-a17b", "--tp", "8", "--dtype", "bf16"]
RUN = ["run", *PROBLEM, "--kernels", "triton_moe"]


def autotune(*args, **kw):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "autotune", *args], cwd=kw.get("cwd", ROOT), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def worker(study, trials, realtime, *extra, batch_sizes="1,8"):
    return autotune("worker", *PROBLEM, "--batch-sizes", batch_sizes, "--replay", str(GRID), "--replay-realtime",
                    str(realtime), "--storage", PG, "--study", study, "--trials", str(trials), "--heartbeat", "1",
                    "--quiet", *extra)


def with_baselines(study, *extra):
    """Measure the study's baselines (SGLang's default and shipped configs) at full replay speed,
    plus one trial per study: a worker replaying slowly so that it can be killed inside a trial
    then starts at its trials instead of spending half a minute on the baselines."""
    p = worker(study, 1, 0.0, *extra)
    out, _ = p.communicate(timeout=300)
    assert p.returncode == 0, out


def studies(study):
    storage = optuna.storages.RDBStorage(PG)
    names = [s.study_name for s in optuna.get_all_study_summaries(storage)
             if s.study_name.startswith(f"triton_moe|{study}~replay|")]
    return {n: optuna.load_study(study_name=n, storage=storage) for n in names}


def measurements_in(url):
    """Device measurements stored in a storage: trial measurements and baselines, once each
    (0 while the run is still creating it: two processes must not initialise one schema)."""
    try:
        storage = optuna.storages.RDBStorage(url, skip_table_creation=True)
        return _count(storage)
    except Exception:
        return 0


def _count(storage):
    n = 0
    for summary in optuna.get_all_study_summaries(storage):
        if not summary.study_name.startswith("triton_moe|"):
            continue
        s = optuna.load_study(study_name=summary.study_name, storage=storage)
        # Only COMPLETE trials hold measurements a run adopts: a process killed between storing a
        # trial's measurement and telling the trial leaves it RUNNING, and the resumed run asks it again.
        n += sum(1 for t in s.trials if t.state == optuna.trial.TrialState.COMPLETE
                 and t.user_attrs.get("measurement", {}).get("status", "invalid") != "invalid")
        n += sum(1 for k in s.user_attrs if k.startswith("baseline:"))
    return n


def reason(study, t):
    return study.user_attrs.get(f"fail_reason:{t.number}", "")


def finish(procs, timeout=300):
    outs = []
    for p in procs:
        out, _ = p.communicate(timeout=timeout)
        outs.append(out)
    return outs


def asked_trials(study):
    return {n: [t for t in s.trials if t.user_attrs.get("asked")] for n, s in studies(study).items()}


@needs_pg
def test_four_workers_share_120_trials_exactly_and_lose_nothing():
    study = f"t4-{uuid.uuid4().hex[:8]}"
    procs = [worker(study, 30, 1.0) for _ in range(4)]      # ~30 s of replayed device time each: they overlap
    outs = finish(procs)
    assert all(p.returncode == 0 for p in procs), outs
    ss = studies(study)
    assert len(ss) == 4                                            # 2 GEMMs x 2 M
    total_with_measurement = 0
    for name, s in ss.items():
        numbers = [t.number for t in s.trials]
        assert len(numbers) == len(set(numbers))                   # no trial number twice
        for t in s.trials:
            assert t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL), (name, t)
            if t.state == optuna.trial.TrialState.FAIL:
                assert reason(s, t), t
        asked = [t for t in s.trials if t.user_attrs.get("asked")]
        assert len(asked) == 30, name                              # exactly the budget
        total_with_measurement += sum(1 for t in s.trials if "measurement" in t.user_attrs
                                      and t.user_attrs["measurement"]["status"] != "invalid")
    # every device measurement a worker reports storing is in the storage, once
    stored = sum(int(re.search(r"stored (\d+) trial measurements", o).group(1)) for o in outs)
    assert stored == total_with_measurement


@needs_pg
def test_killed_worker_trial_is_retried_once_and_the_budget_is_met():
    study = f"kill-{uuid.uuid4().hex[:8]}"

    def running():
        return [t for s in studies(study).values() for t in s.trials
                if t.state == optuna.trial.TrialState.RUNNING and "shared_from" not in t.user_attrs]

    with_baselines(study)
    for attempt in range(3):                       # kill it inside a trial (each ~0.5 s here)
        victim = worker(study, 15, 8.0)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not running():
            time.sleep(0.2)
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        assert time.monotonic() < deadline, "the worker never started a trial"
        if running():                              # the kill landed inside one, not between two
            break
    else:
        pytest.fail("three kills all landed between trials")
    others = [worker(study, 15, 0.5) for _ in range(2)]
    outs = finish(others)
    assert all(p.returncode == 0 for p in others), outs
    ss = studies(study)
    retried = [(s, t) for s in ss.values() for t in s.trials if "failed_trial" in t.system_attrs]
    dead = [t for s in ss.values() for t in s.trials if t.state == optuna.trial.TrialState.FAIL
            and "heartbeating" in reason(s, t)]
    assert dead and len(retried) == len(dead)      # each dead trial re-queued once
    for s, t in retried:                           # and measured, unless the budget was met first
        assert t.state == optuna.trial.TrialState.COMPLETE or "budget was met" in reason(s, t)
    for name, s in ss.items():                     # as many completed asks as an undisturbed run
        assert len([t for t in s.trials if t.user_attrs.get("asked")]) == 15, name


def last_trial_running(study, budget):
    """The study (name) whose budget-th ask is running, from one SQL query on Optuna's tables
    (loading the studies takes longer than the 0.5 s window this looks for)."""
    import sqlalchemy
    asked = "EXISTS (SELECT 1 FROM trial_user_attributes a WHERE a.trial_id = t.trial_id AND a.key = 'asked')"
    q = sqlalchemy.text(f"""
        SELECT s.study_name FROM studies s JOIN trials t ON t.study_id = s.study_id
        WHERE s.study_name LIKE :name AND NOT EXISTS (SELECT 1 FROM trial_user_attributes a
              WHERE a.trial_id = t.trial_id AND a.key = 'shared_from')
        GROUP BY s.study_name
        HAVING SUM(CASE WHEN t.state = 'RUNNING' AND NOT {asked} THEN 1 ELSE 0 END) = 1
           AND SUM(CASE WHEN t.state = 'COMPLETE' AND {asked} THEN 1 ELSE 0 END) = :asked""")
    try:
        with _engine().connect() as c:
            row = c.execute(q, {"name": f"triton_moe|{study}~replay|%", "asked": budget - 1}).first()
    except sqlalchemy.exc.ProgrammingError:     # a fresh database: the worker has not made Optuna's tables yet
        return None
    return row[0] if row else None


@functools.cache
def _engine():
    import sqlalchemy
    return sqlalchemy.create_engine(PG.replace("postgresql://", "postgresql+psycopg://", 1))


@needs_pg
def test_a_dead_workers_last_trial_of_a_study_is_still_retried():
    """The dead trial fills a study's budget (5 asked + it): the others must not stop short."""
    budget = 6
    for attempt in range(3):
        study = f"last-{uuid.uuid4().hex[:8]}"
        with_baselines(study)
        victim = worker(study, budget, 8.0)
        deadline, hit = time.monotonic() + 150, None
        while time.monotonic() < deadline and victim.poll() is None and hit is None:
            hit = last_trial_running(study, budget)
            time.sleep(0.1)   # a config known already is told at once: a measured one still runs
            hit = hit if hit and last_trial_running(study, budget) == hit else None
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        if hit and any(t.state == optuna.trial.TrialState.RUNNING for t in studies(study)[hit].trials):
            break
    else:
        pytest.fail("could not kill the worker inside a study's last trial in 3 tries")
    outs = finish([worker(study, budget, 0.5)])
    s = studies(study)[hit]
    assert not [t for t in s.trials if t.state == optuna.trial.TrialState.RUNNING], outs
    assert len([t for t in s.trials if t.user_attrs.get("asked")]) == budget
    assert any("heartbeating" in reason(s, t) for t in s.trials)


@needs_pg
def test_a_trial_left_running_without_a_heartbeat_is_retried_not_waited_on_forever():
    """A process killed between asking a trial and its first heartbeat leaves a RUNNING trial that
    Optuna never calls stale; the study must still finish with its budget, in bounded time."""
    study = f"nohb-{uuid.uuid4().hex[:8]}"
    first = worker(study, 4, 0.0, batch_sizes="1")
    out, _ = first.communicate(timeout=300)
    assert first.returncode == 0, out
    ss = studies(study)
    orphan_study = next(s for n, s in ss.items() if "|gate_up|M=1" in n)
    orphan = orphan_study.ask()                    # RUNNING, no heartbeat: its process "died" here
    second = worker(study, 5, 0.0, batch_sizes="1")
    out, _ = second.communicate(timeout=120)       # finishes: the orphan is not waited on forever
    assert second.returncode == 0, out
    s = studies(study)[orphan_study.study_name]
    assert s.trials[orphan.number].state == optuna.trial.TrialState.FAIL
    assert "heartbeating" in reason(s, s.trials[orphan.number])
    assert not [t for t in s.trials if t.state == optuna.trial.TrialState.RUNNING]
    assert len([t for t in s.trials if t.user_attrs.get("asked")]) == 5


def test_killed_sqlite_run_resumes_and_exports_what_an_uninterrupted_run_does(tmp_path):
    common = [*RUN, "--batch-sizes", "1,8,64", "--replay", str(GRID), "--trials", "10", "--quiet"]
    a = autotune(*common, "--storage", f"sqlite:///{tmp_path / 'a.db'}", "--out", str(tmp_path / "a"))
    b = autotune(*common, "--storage", f"sqlite:///{tmp_path / 'b.db'}", "--out", str(tmp_path / "b"),
                 "--replay-realtime", "2")
    wait_for_trials(b, tmp_path / "b.db", 40, "the run to interrupt")
    b.send_signal(signal.SIGKILL)                  # mid-search: past the baselines, short of the budget
    b.wait()
    assert not (tmp_path / "b").exists() or not any((tmp_path / "b").rglob("*.json"))
    before = measurements_in(f"sqlite:///{tmp_path / 'b.db'}")
    b2 = autotune(*common, "--storage", f"sqlite:///{tmp_path / 'b.db'}", "--out", str(tmp_path / "b"))
    outs = finish([a, b2])
    assert a.returncode == b2.returncode == 0, outs
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("E=*.json"))
    assert files == sorted(p.relative_to(tmp_path / "b") for p in (tmp_path / "b").rglob("E=*.json"))
    assert len(tuned_files(tmp_path / "a/NVIDIA_H200")) == 2       # ours; the rest is SGLang's shipped overlay
    for f in files:
        assert json.loads((tmp_path / "a" / f).read_text()) == json.loads((tmp_path / "b" / f).read_text())
    run_a, run_b = (next(iter(json.loads((tmp_path / x / "NVIDIA_H200/provenance.json").read_text())
                               ["files"].values()))["run"] for x in ("a", "b"))
    assert run_a["evaluations"] == run_b["evaluations"]          # the same measurements in the end
    careful = run_a["measured_this_run"] - run_a["evaluations"]  # selection's re-measurements
    # the resumed run measured exactly what the killed one had not: nothing twice
    assert 0 < before < run_b["evaluations"]
    assert run_b["measured_this_run"] == run_b["evaluations"] - before + careful


def test_storage_unreachable_at_start_is_one_line_exit_2(tmp_path):
    p = autotune(*RUN, "--batch-sizes", "8", "--replay", str(GRID), "--out", str(tmp_path),
                 "--storage", "postgresql://postgres@127.0.0.1:1/nowhere")
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 2 and "unreachable" in out and "Traceback" not in out
    assert not (tmp_path / "NVIDIA_H200").exists()


def tuned_files(folder):
    """The files export wrote as ours (provenance's `files` and their `_down`), present on disk."""
    prov = json.loads((folder / "provenance.json").read_text())
    names = {n for up, e in prov["files"].items() for n in (up, e["down_file"])}
    return [p for p in folder.rglob("E=*.json") if p.name in names]


def break_sqlite_file(db_path) -> bytes:
    """Turn the whole database file to zeros under a running writer and return what it held.
    Done inside our own exclusive lock, i.e. between the run's transactions: a commit in flight
    rewrites page 1 and healed a broken header (CI, 2026-12-02: the run finished with exit 0)."""
    import sqlite3

    with contextlib.closing(sqlite3.connect(db_path, timeout=60, isolation_level=None)) as c:
        c.execute("BEGIN EXCLUSIVE")
        keep = db_path.read_bytes()
        with open(db_path, "r+b") as f:
            f.write(b"\0" * len(keep))
        c.execute("ROLLBACK")      # nothing changed through this connection: nothing is written
    return keep


def test_storage_lost_mid_run_exports_nothing_and_partial_needs_a_flag(tmp_path, monkeypatch):
    # SQLite's own journal: in write-ahead-log mode a reader finds the pages it needs in the log and a file
    # zeroed under it goes unseen until the log is folded back, so the loss is made where SQLite reads the file
    monkeypatch.setenv("AUTOTUNE_SQLITE_JOURNAL", "delete")
    db = tmp_path / "s.db"
    p = autotune(*RUN, "--batch-sizes", "1,8", "--replay", str(GRID), "--replay-realtime", "1",
                 "--trials", "30", "--storage", f"sqlite:///{db}", "--out", str(tmp_path / "out"), "--quiet")
    wait_for_trials(p, db, 10, "the run whose storage breaks")     # mid-search
    keep = break_sqlite_file(db)
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 3 and "storage lost mid-run" in out and "Traceback" not in out
    assert not any((tmp_path / "out").rglob("E=*.json"))
    db.write_bytes(keep)                           # the study as it was: partial
    args = [*PROBLEM, "--batch-sizes", "1,8", "--replay", str(GRID), "--trials", "30",
            "--storage", f"sqlite:///{db}", "--out", str(tmp_path / "out")]
    e = autotune("export", *args)
    out, _ = e.communicate(timeout=120)
    assert e.returncode == 2 and "partial" in out
    e = autotune("export", *args, "--partial")
    out, _ = e.communicate(timeout=120)
    assert e.returncode == 0, out
    assert len(tuned_files(tmp_path / "out/NVIDIA_H200")) == 2


@needs_pg
def test_workers_started_together_on_a_fresh_database_all_open_it():
    # They race to create Optuna's schema (CI, 2026-12-01: "duplicate key value violates unique
    # constraint pg_type_typname_nsp_index" for 3 of 4 workers); every one must get the storage.
    import sqlalchemy

    name = f"fresh_{uuid.uuid4().hex[:8]}"
    server = sqlalchemy.create_engine(PG, isolation_level="AUTOCOMMIT")
    with server.connect() as c:
        c.execute(sqlalchemy.text(f"CREATE DATABASE {name}"))
    url = PG.rsplit("/", 1)[0] + "/" + name
    try:
        start = time.time() + 4      # one moment for all, after every interpreter has started
        code = ("import sys, time; from autotune.store.storage import open_storage; t = float(sys.argv[2]); "
                "time.sleep(max(0, t - time.time())); open_storage(sys.argv[1], shared=True); print('opened')")
        procs = [subprocess.Popen([sys.executable, "-c", code, url, str(start)], cwd=ROOT, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for _ in range(6)]
        outs = [p.communicate(timeout=120)[0] for p in procs]
        assert [p.returncode for p in procs] == [0] * 6, outs
        assert all("opened" in o for o in outs)
        study = optuna.create_study(storage=optuna.storages.RDBStorage(url), study_name="after")
        assert study.study_name == "after"
    finally:
        with server.connect() as c:
            c.execute(sqlalchemy.text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        server.dispose()


def test_sigterm_stops_a_run_in_one_line_with_exit_143_and_leaves_it_resumable(tmp_path):
    """`docker stop` (SIGTERM) is handled as Ctrl-C: one line, exit 143, no trial left RUNNING
    (the one being measured, if any at that instant, failed with the reason and re-queued), and
    the same command resumes. Which trial is marked is checked deterministically in-process:
    tests/search/test_search.py::test_an_interrupt_marks_the_trial_in_flight_and_the_run_resumes."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    common = [*RUN, "--batch-sizes", "1,8", "--replay", str(GRID), "--trials", "10", "--quiet",
              "--storage", url, "--out", str(tmp_path / "out")]
    p = autotune(*common, "--replay-realtime", "2")
    wait_for_trials(p, tmp_path / "s.db", 4, "the run to stop")
    p.send_signal(signal.SIGTERM)
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 143, out
    assert "Traceback" not in out and out.strip().splitlines()[-1].startswith("autotune: stopped by SIGTERM")
    storage = optuna.storages.RDBStorage(url)
    studies = [optuna.load_study(study_name=x.study_name, storage=storage) for x in optuna.get_all_study_summaries(storage)]
    names = max((set(t.params) for s in studies for t in s.trials if t.state == optuna.trial.TrialState.COMPLETE), key=len)
    for s in studies:
        assert not [t for t in s.trials if t.state == optuna.trial.TrialState.RUNNING]
        for t in s.trials:
            if t.state == optuna.trial.TrialState.FAIL:
                assert reason(s, t).startswith("interrupted")
                # asked first on resume: the config of a finished ask; of a stop inside `ask` (Optuna
                # stores parameters one by one), what that ask took from the queue (CI, session 12:
                # a stop between num_warps and num_stages of a queued seed), else nothing
                again = t.params if set(t.params) == names else t.system_attrs.get("fixed_params")
                if again:
                    assert again in [w.system_attrs.get("fixed_params") for w in s.trials
                                     if w.state == optuna.trial.TrialState.WAITING]
    resumed = autotune(*common)
    out, _ = resumed.communicate(timeout=400)
    assert resumed.returncode == 0, out
    assert len(tuned_files(tmp_path / "out/NVIDIA_H200")) == 2


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=needs_pg)])
def test_a_second_run_on_the_same_studies_is_refused_before_measuring(tmp_path, backend):
    """Two `autotune run`s of one run name on one storage would double its trials: the second
    says so in one line, exit 2, and the first finishes with exactly its budget."""
    url = f"sqlite:///{tmp_path / 's.db'}" if backend == "sqlite" else PG
    study = f"two-{uuid.uuid4().hex[:8]}"
    common = [*RUN, "--batch-sizes", "1", "--replay", str(GRID), "--trials", "6", "--quiet", "--storage", url,
              "--study", study]
    first = autotune(*common, "--replay-realtime", "1", "--out", str(tmp_path / "a"))
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and first.poll() is None and "device:" not in (first.stdout.readline() or ""):
        pass
    assert first.poll() is None, "the first run never got going"
    second = autotune(*common, "--out", str(tmp_path / "b"))
    out, _ = second.communicate(timeout=300)
    assert second.returncode == 2, out
    assert "another `autotune run`" in out and "Traceback" not in out
    assert not (tmp_path / "b").exists()
    rest, _ = first.communicate(timeout=400)
    assert first.returncode == 0, rest
    storage = optuna.storages.RDBStorage(url)
    for s in optuna.get_all_study_summaries(storage):
        if f"|{study}~replay|" in s.study_name:
            trials = optuna.load_study(study_name=s.study_name, storage=storage).trials
            assert len([t for t in trials if t.user_attrs.get("asked")]) == 6     # not doubled
