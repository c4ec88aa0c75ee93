"""One `autotune run` per (storage, run name) at a time.

A run owns its studies: it re-queues an interrupted trial on resume and asks without heartbeats,
so a second run on the same studies would double the trials and trip over the first one's
(UpdateFinishedTrialError). The second run is refused before it measures anything; sharing a
study is what `autotune worker` is for.

The lock dies with its process (a killed run never leaves a stale one): for SQLite an flock on a
file beside the database (`.<db>.run-<key>.lock`, autotune.fileio.locks: the processes that reach the
database reach it, whatever their TMPDIR; removed when the run ends), a session advisory lock for
PostgreSQL. A database held in memory is its process's own: nothing to lock.
"""
from __future__ import annotations

import contextlib
import hashlib
import os

from autotune.fileio import locks


class RunLocked(RuntimeError):
    pass


def _key(url: str, run: str) -> str:
    from autotune.store.storage import target

    file = target(url).file
    if file is not None:            # one lock per database file, however the URL names it
        url = "sqlite:///" + str(file.resolve())
    return hashlib.sha1(f"{url}\n{run}".encode()).hexdigest()


@contextlib.contextmanager
def run_lock(storage, url: str, run: str):
    """Hold the run's lock while the block runs; RunLocked if another process holds it."""
    from autotune.store.storage import target

    key = _key(url, run)
    if url.startswith("postgresql"):
        with _pg_lock(storage, key, url, run):
            yield
        return
    file = target(url).file
    if file is None:
        yield
        return
    path = file.parent / f".{file.name}.run-{key[:16]}.lock"
    try:
        fd = locks.take(path, f"pid {os.getpid()}")
    except locks.Busy as e:
        raise RunLocked(_message(url, run, str(e))) from None
    try:
        yield
    finally:
        locks.release(path, fd)        # the flock goes, and the file with it


@contextlib.contextmanager
def _pg_lock(storage, key: str, url: str, run: str):
    import sqlalchemy

    conn = storage.engine.connect()
    try:
        got = conn.execute(sqlalchemy.text("SELECT pg_try_advisory_lock(:k)"),
                           {"k": int(key[:15], 16)}).scalar()
        if not got:
            raise RunLocked(_message(url, run, "another process"))
        yield
    finally:
        conn.close()          # the session ends: PostgreSQL releases its advisory locks


def _message(url: str, run: str, holder: str) -> str:
    from autotune.store.storage import safe_url
    return (f"another `autotune run` ({holder}) is tuning run {run!r} in {safe_url(url)}; wait for it to "
            "finish, or tune together with `autotune worker` (shared studies)")
