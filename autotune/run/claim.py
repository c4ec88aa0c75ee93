"""The storage a command's studies live in, opened and the run name claimed there (autotune.store.storage):
each run name belongs to one GPU model. Claiming writes, and a storage is only known to be writable
by writing it, so this step has no check: it is the first to run after every check passed (the pool
aside), and a storage it cannot claim is said before anything is measured. Then `autotune run`'s hold
on the run name (autotune.store.run_lock)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from autotune.errors import UsageError
from autotune.run.step import Step

if TYPE_CHECKING:
    from optuna.storages import BaseStorage


@dataclass
class ClaimStorage(Step):
    needs = ("request", "device", "run_name", "held", "plans")   # plans: what `export`'s reads checks
    provides = ("storage",)
    heartbeat_s: float | None = None   # `worker`: studies shared with other processes, each alive by its heartbeats
    # `export`: reads a run that exists; reads(storage) checks what it needs of it first
    reads: Callable[[BaseStorage], None] | None = None

    def run(self, ctx) -> None:
        from autotune.store.storage import StorageError, claim, open_storage, target

        req, existing, shared = ctx.request, self.reads is not None, self.heartbeat_s is not None
        try:
            storage = open_storage(req.storage, shared=shared, heartbeat_s=self.heartbeat_s if shared else 10,
                                   existing=existing, reads_only=existing)
            if existing:
                self.reads(storage)
            claim(storage, ctx.run_name, ctx.device, existing=existing)
        except StorageError as e:
            raise UsageError(str(e))
        engine = getattr(storage, "engine", None)
        if engine is not None:
            # closed with the command, however it ends: a SQLite file's write-ahead log is folded back into it
            # and removed when its last connection closes (autotune.store.storage.quick_commits)
            ctx.held.callback(engine.dispose)
        if req.storage and target(req.storage).in_memory:
            print(f"note: --storage {req.storage} is held in memory: nothing measured is kept, a stopped run "
                  "cannot resume")
        ctx.storage = storage


class RunLock(Step):
    """`autotune run`'s hold on its run name, taken once the storage is claimed and kept to the end."""
    needs = ("request", "storage", "run_name", "held")

    def run(self, ctx) -> None:
        from autotune.store.run_lock import run_lock
        from autotune.store.storage import DEFAULT_STORAGE

        ctx.held.enter_context(run_lock(ctx.storage, ctx.request.storage or DEFAULT_STORAGE, ctx.run_name))
