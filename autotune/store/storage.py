"""The Optuna storage the studies live in: opened (a fresh database's schema race, an unreachable or
read-only one said in one line), claimed by one GPU model per run name, and the trials a stop or a
dead worker leaves behind failed with their reason and queued again."""
from __future__ import annotations

import contextlib
import datetime
import math
import random
import threading
import time
import warnings
from pathlib import Path

import optuna

from autotune.contract.config import KernelConfig
from autotune.measure.records import INVALID, Measurement, is_resource_failure
from autotune.store.storage_url import safe_url, scrub, sqlite_journal

# Optuna's INFO lines ("A new study created in RDB ...") are not the run's to print: quiet from the
# first storage opened (--log-level debug turns them back on).
optuna.logging.set_verbosity(optuna.logging.WARNING)

ATTR = "measurement"          # the trial attribute holding its Measurement (records.Measurement.to_dict)


class StorageError(RuntimeError):
    pass


DEFAULT_STORAGE = "sqlite:///autotune.db"


def target(url: str):
    """What `url` names (storage_url.StorageTarget: the SQLite file SQLite opens, in memory, read-only);
    StorageError, one line with its password parts masked, when it names nothing SQLAlchemy opens."""
    from autotune.store.storage_url import StorageUrlError, parse

    try:
        return parse(url)
    except StorageUrlError as e:
        raise StorageError(f"storage {safe_url(url)} {e}") from None


def sqlite_file(url: str) -> Path | None:
    """The file SQLite opens for `url` (None: in memory, or another database)."""
    return target(url).file


def _tables(url: str) -> set[str]:
    """The tables the database already holds (none for a SQLite file not made yet: not created here)."""
    import sqlalchemy

    file = sqlite_file(url)
    if file is not None and not file.exists():
        return set()
    engine = sqlalchemy.create_engine(url)
    try:
        return set(sqlalchemy.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def _schema_problem(url: str, tables: set[str], existing: bool) -> str | None:
    """Why the database is not one to open, read before anything is created in it: Optuna's RDBStorage
    adds its tables to any database first and checks its schema after."""
    from optuna.storages._rdb.models import BaseModel     # Optuna's own table list, not a copy of it

    optuna_tables = set(BaseModel.metadata.tables)
    where = f"storage {safe_url(url)}"
    foreign = sorted(tables - optuna_tables - {"alembic_version"})
    if foreign:
        return (f"{where} holds tables that are not Optuna's ({', '.join(foreign[:5])}): "
                "studies are kept in a database of their own; name another --storage")
    if tables and optuna_tables - tables:
        return (f"{where} is an Optuna storage without its tables {sorted(optuna_tables - tables)[:3]} (another "
                f"release's schema, or a damaged one): `optuna storage upgrade --storage {safe_url(url)}`, or name "
                "another --storage")
    if existing and not tables:
        return f"{where} holds no studies (nothing was measured into it): check --storage"
    return None


def open_storage(url: str | None, shared: bool = False, heartbeat_s: int = 10, existing: bool = False,
                 reads_only: bool = False):
    """Optuna's RDB storage. `shared`: several processes tune the same studies, so each one
    records heartbeats for its running trials, and a trial whose process died (no heartbeat for
    3 intervals) is failed and re-queued once with the same parameters (never lost, never
    measured twice as a completed trial). `existing`: it must hold studies already (export reads
    one); nothing is created in it. `reads_only`: the caller never writes (a warm start, export), so a
    read-only storage (`mode=ro`, `immutable=1`) is one to open. A database that is not an Optuna storage is
    refused untouched."""
    url = url or DEFAULT_STORAGE
    where = target(url)
    if where.read_only and not reads_only:
        # a run keeps its measurements there, and export and worker write their studies' bookkeeping
        raise StorageError(f"storage {safe_url(url)} is read-only ({where.read_only}): it cannot hold a run; name a "
                           "writable one (a read-only storage can be a --warm-start)")
    file = where.file
    try:
        tables = _tables(url)
    except Exception as e:
        first = scrub(str(e).splitlines()[0], url) if str(e) else ""
        raise StorageError(f"storage {safe_url(url)} unreachable: {type(e).__name__}: {first}") from None
    why = _schema_problem(url, tables, existing)
    if why:
        raise StorageError(why)
    if file is not None and where.creates and not existing:
        # SQLite creates the file, not its folder: `--storage sqlite:///runs/a.db` should just work.
        with contextlib.suppress(OSError):
            file.parent.mkdir(parents=True, exist_ok=True)
    kwargs = {"skip_table_creation": bool(tables)}
    if shared:
        kwargs.update(heartbeat_interval=heartbeat_s, grace_period=3 * heartbeat_s,
                      heartbeat_stale_trial_callback=retry_dead_workers_trial)
    attempts = 8
    for attempt in range(attempts):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                storage = optuna.storages.RDBStorage(url, engine_kwargs={"pool_pre_ping": True}, **kwargs)
            return quick_commits(storage) if file is not None and not where.read_only else storage
        except Exception as e:
            # Workers started together on a fresh database race to create Optuna's schema; the
            # losers see "already exists" / a duplicate key. The schema is there a moment later.
            if attempt < attempts - 1 and _lost_schema_race(e):
                time.sleep(0.2 + random.random() * 0.3 * (attempt + 1))
                continue
            first = scrub(str(e).splitlines()[0], url) if str(e) else ""
            if any(k in first.lower() for k in (*READ_ONLY_SAYS, *FULL_SAYS)):
                raise _unwritable(url, first) from None
            raise StorageError(f"storage {safe_url(url)} unreachable: {type(e).__name__}: {first}") from None




def quick_commits(storage):
    """A SQLite file in write-ahead-log mode with synchronous=NORMAL: a commit appends to the log and syncs at
    checkpoints, not at every transaction. Optuna commits every parameter, trial and attribute apart (about ten
    per measurement); with a sync each they took ~4 ms, and the run's own process, storing and asking, fell
    behind the GPU it feeds. A process killed mid-run loses nothing committed (WAL is atomic and durable across
    a crash of the program; only a power cut can lose the last commits, never corrupt the file).
    AUTOTUNE_SQLITE_JOURNAL=delete keeps SQLite's own journal (a file on NFS, say: its log needs shared memory)."""
    import sqlalchemy

    if sqlite_journal() != "wal":
        return storage

    @sqlalchemy.event.listens_for(storage.engine, "connect")
    def _pragmas(dbapi_connection, record):
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()
    storage.engine.dispose()            # the connections made so far (creating the schema) go: new ones get it
    return storage


# How SQLite and PostgreSQL say a storage cannot be written: it is read-only, or its disk is full
READ_ONLY_SAYS = ("readonly database", "read-only", "permission denied")
FULL_SAYS = ("disk is full", "no space left", "disk full", "could not extend file")


def _unwritable(url: str, why: str) -> StorageError:
    if any(k in why.lower() for k in FULL_SAYS):
        return StorageError(f"storage {safe_url(url)} cannot be written ({why}): the disk that holds it is full; "
                            "free some space, or point --storage at another disk")
    return StorageError(f"storage {safe_url(url)} cannot be written ({why}): a read-only file or database user; "
                        "point --storage at a writable one")


def _lost_schema_race(e: Exception) -> bool:
    """A concurrent CREATE TABLE / CREATE TYPE of another process (PostgreSQL SQLSTATEs
    unique_violation, duplicate_table, duplicate_object; SQLite's "already exists")."""
    orig = getattr(e, "orig", None)
    if getattr(orig, "sqlstate", None) in ("23505", "42P07", "42710"):
        return True
    return "already exists" in str(e)


def fail_reason(study, number: int, why: str) -> None:
    """Why a trial ended FAIL. Kept on the study: a finished trial's own attributes are frozen."""
    study.set_user_attr(f"fail_reason:{number}", why)


def retry_dead_workers_trial(study, trial) -> None:
    """A trial whose worker stopped heartbeating: say so, and queue its parameters once."""
    fail_reason(study, trial.number, "its worker stopped heartbeating (killed or hung); re-queued once")
    optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=1)(study, trial)


def fail_dead_trials(study) -> None:
    """Fail the trials of processes that stopped heartbeating (each is re-queued once)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)


def requeue(study, trial, why: str, names) -> None:
    """Fail a trial that was never told, with the reason, and queue what its ask must be again.
    Optuna stores an ask's parameters one commit at a time, so a stop can land inside `ask`:
    - all of `names` set: the ask was done and the config being checked or measured is queued;
    - else the parameters the ask took from the queue, if any (the rest is sampled again);
    - else nothing: the resumed run asks afresh with the same seed (a failed trial is not counted
      as an ask), and samples what the stopped ask would have. Queuing the half it had set made
      the resumed run sample the other half differently (a resume that diverged from the run it continues)."""
    fail_reason(study, trial.number, why)
    study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
    params = trial.params if set(names) <= set(trial.params) else trial.system_attrs.get("fixed_params")
    if params:
        study.enqueue_trial(params, skip_if_exists=False)


def claim(storage, run: str, device, existing: bool = False) -> None:
    """Each run name belongs to one GPU model: measurements of another would poison its studies.
    Claiming writes, so a storage that cannot be written is said here, before any measuring (it
    used to surface at the first trial as "storage lost mid-run"). `existing`: the run must be in
    the storage already (export reads it; a misspelt --study is said, not created)."""
    if existing:
        runs = sorted(n.split("|", 1)[1] for n in optuna.get_all_study_names(storage) if n.startswith("autotune-run|"))
        if run not in runs:
            raise StorageError(f"storage {safe_url(str(getattr(storage, 'url', '')))} holds no run '{run}' "
                               f"(it holds {', '.join(runs[:6]) if runs else 'none'}): check --study and --storage")
    try:
        if existing:                # read, never created: a read-only storage is one export reads
            meta = optuna.load_study(study_name=f"autotune-run|{run}", storage=storage)
        else:
            meta = optuna.create_study(study_name=f"autotune-run|{run}", storage=storage, load_if_exists=True)
        owner = meta.user_attrs.get("device")
        if owner is not None and owner != device.name:
            raise StorageError(f"run '{run}' in this storage belongs to {owner}; this is {device.name}: "
                               f"it cannot join (give it its own --study name)")
        if owner is None and not existing:
            meta.set_user_attr("device", device.name)
            meta.set_user_attr("sm", device.sm)
        if not existing:       # export only reads the run: its storage stays byte-identical
            meta.set_user_attr("opened", datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    except optuna.exceptions.StorageInternalError as e:
        cause = e.__cause__ or e.__context__ or e
        raise _unwritable(str(getattr(storage, "url", "")),
                          str(cause).splitlines()[0] if str(cause) else type(cause).__name__) from None


# -- the store: what both tuners keep in the storage, kept apart from how they search -------------
# (TVM MetaSchedule's Database: commit a measurement, ask for the best; the search loops only decide
# what to measure.) Keys are (part, M): part is a GEMM of a Triton-config family or the whole layer.

def config_study_name(family: str, device_name: str, problem_key: str, gemm: str, M: int) -> str:
    """A Triton-config family's study: one per (problem, GEMM, M)."""
    return f"{family}|{device_name}|{problem_key}|{gemm}|M={M}"


def backend_study_name(family: str, device_name: str, problem_key: str, M: int) -> str:
    # "|sieve": the params' value sets are every declared backend (the same on every machine; the
    # sieve's declarations added backends) and an integer tactic id; studies of older releases (other
    # value sets, which Optuna refuses to mix) are left alone under their old names.
    return f"{family}|{device_name}|{problem_key}|M={M}|sieve"


class Store:
    """One problem's studies and the index of what they hold: every measurement by (part, M) and
    config key, the careful re-measurements, the baselines. Rebuilt from the storage (so a resumed
    run re-measures nothing) and written through (so an interrupted one loses nothing)."""

    def __init__(self, storage, dists: dict):
        self.storage, self.dists = storage, dists        # dists: (part, M) -> the trials' distributions
        # Shared storages (heartbeats on) have other processes' trials RUNNING legitimately.
        self.shared = bool(getattr(storage, "heartbeat_interval", None))
        # A read-only storage (`mode=ro`, `immutable=1`: export reads one): what is measured again (the
        # baselines, the careful re-measurements of the finalists) is kept in memory, never stored.
        url = getattr(storage, "url", None)
        self.read_only = bool(url and target(str(url)).read_only)
        self.studies: dict = {}
        self.measured: dict = {key: {} for key in dists}   # (part, M) -> config.key -> Measurement
        self.careful: dict = {}      # (part, M, config.key) -> careful re-measurement (selection)
        self.indexed: dict = {key: set() for key in dists}  # trial numbers already read
        self.running: dict = {}      # trial_id -> study: ours, given heartbeats while measured
        self._adopted: set = set()   # other processes' trial ids given a heartbeat (see adopt)
        self._none_queued: set = set()   # (part, M) whose unshared study this process read holding no WAITING

    def open(self, key, name: str):
        """The study of (part, M), created on first use (read where it exists: asking to create it first
        is a write, which a read-only storage export reads from refuses)."""
        try:
            self.studies[key] = optuna.load_study(study_name=name, storage=self.storage)
        except KeyError:
            self.studies[key] = optuna.create_study(study_name=name, storage=self.storage, direction="minimize",
                                                    load_if_exists=True)
        return self.studies[key]

    # -- reading ---------------------------------------------------------------------------------
    def sync(self, key, resume: bool = False) -> tuple[list, set, int]:
        """Index the study's trials not read yet (other processes add some while we run); returns
        the study's trials, the numbers of those re-queued here (an interrupted run's) and how many
        newly read ones were measured asks."""
        study, indexed = self.studies[key], self.indexed[key]
        if self.shared:
            # A dead process's trial holds a place in the budget until it is failed and re-queued;
            # done when reading, not only when asking, so a study it filled does not stay short.
            fail_dead_trials(study)
        trials = study.get_trials(deepcopy=False)
        requeued: set = set()
        newly_asked = 0
        for t in trials:
            running = t.state == optuna.trial.TrialState.RUNNING
            if running and self.shared and "shared_from" not in t.user_attrs:
                self.adopt(t)
            if t.number in indexed:
                continue
            if running:
                if resume and not self.shared:
                    # One `autotune run` owns an unshared study: a RUNNING trial was interrupted.
                    # Ask its parameters again first, so the resumed run follows the same path.
                    requeue(study, t, "interrupted (the run was stopped); asked again on resume", self.dists[key])
                    self._none_queued.discard(key)
                    indexed.add(t.number)
                    requeued.add(t.number)
                continue
            indexed.add(t.number)
            if t.state != optuna.trial.TrialState.COMPLETE or ATTR not in t.user_attrs:
                continue
            m = Measurement.from_dict(t.user_attrs[ATTR])
            if is_resource_failure(m):
                if not self.read_only:          # healed by the next command that may write
                    self._heal(study, t)
                    self._none_queued.discard(key)
                continue
            self.measured[key].setdefault(m.config.key, m)
            if t.user_attrs.get("asked") and m.status != INVALID:
                newly_asked += 1
        for name, value in study.user_attrs.items():
            if name.startswith("baseline:"):
                m = Measurement.from_dict(value)
                if not is_resource_failure(m):      # else measured again (autotune.search.study's baselines)
                    self.measured[key].setdefault(m.config.key, m)
            elif name.startswith("careful:"):
                m = Measurement.from_dict(value)
                if not is_resource_failure(m):      # else re-measured by the selection
                    self.careful.setdefault((*key, m.config.key), m)
        return trials, requeued, newly_asked

    @staticmethod
    def _heal(study, t) -> None:
        """An asked trial an earlier release told as its config's failure for want of GPU memory: not
        counted against the budget, not known, and its config queued once to be asked again."""
        mark = f"healed:{t.number}"
        if t.user_attrs.get("asked") and mark not in study.user_attrs:
            study.set_user_attr(mark, "a resource failure (GPU memory or device), measured again")
            study.enqueue_trial(t.params, skip_if_exists=False)

    def enqueue(self, key, params: dict) -> None:
        """Queue `params` (ladder positions) for the next ask of (part, M)'s study, once."""
        self._none_queued.discard(key)
        self.studies[key].enqueue_trial(params, skip_if_exists=True)

    def has_queued(self, key) -> bool:
        """Whether (part, M)'s study holds a trial queued for its next ask. Read from the storage, except where
        this process knows: an unshared study's queue grows only by this process's enqueues (each forgets
        what was known) and shrinks only by its asks, so once read empty it stays empty until one. A shared
        study's other processes queue too: read every time."""
        if key in self._none_queued:
            return False
        if self.studies[key].get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)):
            return True
        if not self.shared:
            self._none_queued.add(key)
        return False

    def known(self, key, config: KernelConfig):
        return self.measured[key].get(config.key)

    def top(self, key, k: int | None = None, keep=None) -> list:
        """The ok measurements of (part, M), fastest first (ties in storage order); `keep` filters."""
        oks = [m for m in self.measured[key].values() if m.ok and (keep is None or keep(m))]
        return sorted(oks, key=lambda m: m.time_us)[:k]

    # -- committing ------------------------------------------------------------------------------
    def commit(self, key, m, params: dict, attrs: dict | None = None) -> None:
        """A measurement as a completed trial of its own (a neighbour's, a backend's)."""
        self.measured[key][m.config.key] = m
        self.studies[key].add_trial(optuna.trial.create_trial(
            params=params, distributions=self.dists[key], value=m.time_us if m.ok else math.inf,
            user_attrs={ATTR: m.to_dict(), **(attrs or {})}))

    def commit_told(self, key, trial, m) -> bool:
        """An asked trial's measurement, told. False: another process declared the trial dead
        (missed heartbeats) and re-queued it meanwhile; the caller keeps the measurement apart."""
        self.measured[key][m.config.key] = m
        trial.set_user_attr(ATTR, m.to_dict())
        trial.set_user_attr("asked", True)
        try:
            self.studies[key].tell(trial, m.time_us if m.ok else math.inf)
        except (optuna.exceptions.UpdateFinishedTrialError, RuntimeError, ValueError):
            return False
        self.indexed[key].add(trial.number)
        return True

    def commit_baseline(self, key, m, name: str) -> None:
        self.measured[key][m.config.key] = m
        if not self.read_only:
            self.studies[key].set_user_attr(f"baseline:{name}", m.to_dict())

    def commit_careful(self, key, m) -> None:
        self.careful[(*key, m.config.key)] = m
        if not self.read_only:
            self.studies[key].set_user_attr(f"careful:{m.config.key}", m.to_dict())

    # -- liveness: heartbeats, dead trials, stops ------------------------------------------------
    def adopt(self, t) -> None:
        """A process killed between asking a trial and its first heartbeat leaves it RUNNING with
        no heartbeat, which Optuna never declares stale. Give each other process's trial older
        than the grace period one heartbeat: a live one is unaffected (it beats anyway), a dead
        one turns stale one grace period later and is failed and re-queued like any other."""
        if t._trial_id in self.running or t._trial_id in self._adopted or t.datetime_start is None:
            return
        if (datetime.datetime.now() - t.datetime_start).total_seconds() > self.storage.grace_period:
            self._adopted.add(t._trial_id)
            self.storage.record_heartbeat(t._trial_id)

    def measuring(self, key, trial) -> None:
        self.running[trial._trial_id] = self.studies[key]
        if self.shared:
            # The first heartbeat now: a trial never heartbeated is never declared stale.
            self.storage.record_heartbeat(trial._trial_id)

    @contextlib.contextmanager
    def heartbeats(self):
        """While this process measures a shared study's trials, tell the storage it is alive."""
        if not self.shared:
            yield
            return
        stop = threading.Event()

        def beat():
            while not stop.wait(self.storage.heartbeat_interval / 2):
                for trial_id in list(self.running):
                    try:
                        self.storage.record_heartbeat(trial_id)
                    except Exception:
                        pass
        thread = threading.Thread(target=beat, daemon=True)
        thread.start()
        try:
            with warnings.catch_warnings():
                # Optuna warns at every ask that heartbeats are meant for Study.optimize; a worker asks and
                # tells itself and beats for its trials here, so the warning is no news (12 lines a worker).
                warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used",
                                        category=UserWarning)
                yield
        finally:
            stop.set()
            thread.join()

    def requeue_running(self, why: str) -> None:
        """The trials being asked or measured when the run was stopped: failed with the reason and
        their parameters queued, so the resumed run (or another worker, at once) asks them first.
        A shared study's RUNNING trials of other processes are theirs, not ours."""
        for key, study in self.studies.items():
            for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
                if "shared_from" in t.user_attrs or (self.shared and t._trial_id not in self.running):
                    continue
                self._none_queued.discard(key)
                try:
                    requeue(study, t, why, self.dists[key])
                except (optuna.exceptions.UpdateFinishedTrialError, RuntimeError, ValueError):
                    pass               # told meanwhile (a worker's result landed): nothing to re-queue

    def close_queue(self, key) -> None:
        """A shared study whose budget is met: trials queued for the next ask (a dead worker's
        retry) that nobody needs end as FAIL with that reason."""
        study = self.studies[key]
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)):
            trial_id = self.storage.get_trial_id_from_study_id_trial_number(study._study_id, t.number)
            # Claim it first (WAITING -> RUNNING is atomic; False if another worker took it).
            if self.storage.set_trial_state_values(trial_id, optuna.trial.TrialState.RUNNING):
                fail_reason(study, t.number, "queued but not needed: the study's budget was met")
                self.storage.set_trial_state_values(trial_id, optuna.trial.TrialState.FAIL)
