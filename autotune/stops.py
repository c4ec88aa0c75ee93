"""Ctrl-C and `docker stop` (SIGTERM) while tuning: the stop is delivered only where nothing is
half-written. Inside `deferred()` (the tuning loops: asks, tells, commits, re-queues) a signal is
remembered and raised as KeyboardInterrupt at the next `wait()` (the pool's wait for results) or at
the end of the block, never inside a storage call: a KeyboardInterrupt raised inside SQLAlchemy can
leave a connection holding SQLite's write lock, and the re-queue that follows then fails (the
trial is left RUNNING after SIGTERM). Outside those blocks a stop lands at once, as usual.
A second signal while one is pending lands at once too (a user who presses Ctrl-C again means it).
Once the stop is being said (or the command has returned and the process only ends), a further
signal ends the process at once with the command's code: never a traceback from inside the message
or the interpreter's shutdown, never death by the signal instead of 130."""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading

_depth = 0              # > 0: inside deferred(), main thread
_measuring = 0          # > 0: inside deferred() (a tuning loop), whatever a wait() inside it does to _depth
_pending: int | None = None
_seen: list[int] = []   # every stop signal received, first first
_while_measuring: list[bool] = []   # for each: whether a tuning loop was running


def stopped_by() -> int | None:
    """The first stop signal this process received (signal.SIGINT / SIGTERM), or None."""
    return _seen[0] if _seen else None


def stopped_while_measuring() -> bool:
    """Whether the first stop landed while trials were being measured (their re-queue is what a re-run
    resumes); a command stopped elsewhere (publish, check, merge-caches, a run before its search)
    measured nothing that a stop could leave half-told."""
    return bool(_while_measuring and _while_measuring[0])


def _on_signal(signum, frame):
    global _pending
    _seen.append(signum)
    _while_measuring.append(_measuring > 0)
    if signum == signal.SIGTERM:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)   # a second SIGTERM ends the process at once
    if _depth > 0 and _pending is None:
        _pending = signum
        return
    _pending = None
    raise KeyboardInterrupt


def install(sigterm: bool = True) -> None:
    """The CLI's handlers: SIGINT, and SIGTERM treated as Ctrl-C (then exit 143); a new command, so
    no stop is remembered."""
    global _pending
    _pending = None
    _seen.clear()
    _while_measuring.clear()
    signal.signal(signal.SIGINT, _on_signal)
    if sigterm:
        signal.signal(signal.SIGTERM, _on_signal)


def finishing(code: int | None = None) -> None:
    """From here on the process only ends: a stop signal exits at once with `code` (None: 130, or 143
    where the first stop was SIGTERM), what was printed flushed, nothing else run."""
    def exit_now(signum, frame):
        first = stopped_by() or signum
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):     # a write the signal cut short cannot be flushed
                stream.flush()
        os._exit(code if code is not None else 143 if first == signal.SIGTERM else 130)
    signal.signal(signal.SIGINT, exit_now)
    signal.signal(signal.SIGTERM, exit_now)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def deferred():
    """A block whose storage writes must not be cut (a tuning loop: asks, tells, re-queues): a stop
    arriving inside waits for a wait()."""
    global _depth, _measuring
    if not _main_thread():
        yield
        return
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        install(sigterm=False)      # a library caller (tests, api.run): Ctrl-C deferred the same way
    _depth += 1
    _measuring += 1
    try:
        yield
    finally:
        _depth -= 1
        _measuring -= 1
    if _depth == 0:
        checkpoint()


@contextlib.contextmanager
def wait():
    """A blocking wait (for workers' results, a sleep): a pending stop is raised here, and one that
    arrives during the wait lands at once."""
    global _depth
    if not _main_thread():
        yield
        return
    saved, _depth = _depth, 0
    try:
        checkpoint()
        yield
    finally:
        _depth = saved


def checkpoint() -> None:
    global _pending
    if _pending is not None:
        _pending = None
        raise KeyboardInterrupt
