"""The Optuna storage the studies live in: opened (a fresh database's schema race, an unreachable or
read-only one said in one line), claimed by one GPU model per run name, and the trials a stop or a
dead worker leaves behind failed with their reason and queued again."""
from __future__ import annotations

import contextlib
import datetime
import random
import time
from pathlib import Path

import optuna

ATTR = "measurement"          # the trial attribute holding its Measurement (records.Measurement.to_dict)


class StorageError(RuntimeError):
    pass


DEFAULT_STORAGE = "sqlite:///autotune.db"


def open_storage(url: str | None, shared: bool = False, heartbeat_s: int = 10):
    """Optuna's RDB storage. `shared`: several processes tune the same studies, so each one
    records heartbeats for its running trials, and a trial whose process died (no heartbeat for
    3 intervals) is failed and re-queued once with the same parameters (never lost, never
    measured twice as a completed trial)."""
    import warnings

    url = url or DEFAULT_STORAGE
    if url.startswith("sqlite:///") and url != "sqlite:///:memory:" and not url.startswith("sqlite:///file:"):
        # SQLite creates the file, not its folder: `--storage sqlite:///runs/a.db` should just work.
        with contextlib.suppress(OSError):
            Path(url[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
    kwargs = {}
    if shared:
        kwargs = dict(heartbeat_interval=heartbeat_s, grace_period=3 * heartbeat_s,
                      heartbeat_stale_trial_callback=retry_dead_workers_trial)
    attempts = 8
    for attempt in range(attempts):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return optuna.storages.RDBStorage(url, engine_kwargs={"pool_pre_ping": True}, **kwargs)
        except Exception as e:
            # Workers started together on a fresh database race to create Optuna's schema; the
            # losers see "already exists" / a duplicate key. The schema is there a moment later.
            if attempt < attempts - 1 and _lost_schema_race(e):
                time.sleep(0.2 + random.random() * 0.3 * (attempt + 1))
                continue
            first = str(e).splitlines()[0] if str(e) else ""
            if any(k in first.lower() for k in ("readonly database", "read-only", "permission denied")):
                raise _unwritable(url, first) from None
            raise StorageError(f"storage {safe_url(url)} unreachable: {type(e).__name__}: {first}") from None


def _unwritable(url: str, why: str) -> StorageError:
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
    import warnings

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
      the resumed run sample the other half differently (CI, 2026-12-02: a divergent resume)."""
    fail_reason(study, trial.number, why)
    study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
    params = trial.params if set(names) <= set(trial.params) else trial.system_attrs.get("fixed_params")
    if params:
        study.enqueue_trial(params, skip_if_exists=False)


def safe_url(url: str) -> str:
    import re
    return re.sub(r"//([^:/@]+):([^@]+)@", r"//\1:***@", url)


def claim(storage, run: str, device) -> None:
    """Each run name belongs to one GPU model: measurements of another would poison its studies.
    Claiming writes, so a storage that cannot be written is said here, before any measuring (it
    used to surface at the first trial as "storage lost mid-run")."""
    try:
        meta = optuna.create_study(study_name=f"autotune-run|{run}", storage=storage, load_if_exists=True)
        owner = meta.user_attrs.get("device")
        if owner is not None and owner != device.name:
            raise StorageError(f"run '{run}' in this storage belongs to {owner}; this is {device.name}: "
                               f"it cannot join (give it its own --study name)")
        if owner is None:
            meta.set_user_attr("device", device.name)
            meta.set_user_attr("sm", device.sm)
        meta.set_user_attr("opened", datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    except optuna.exceptions.StorageInternalError as e:
        cause = e.__cause__ or e.__context__ or e
        raise _unwritable(str(getattr(storage, "url", "")),
                          str(cause).splitlines()[0] if str(cause) else type(cause).__name__) from None
