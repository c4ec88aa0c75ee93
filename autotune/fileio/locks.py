"""One process's exclusive lock: an flock on a lock file, the file removed again when the lock is let go.
Where the lock file lies is the caller's: next to the thing it guards (a tuned folder, a SQLite storage), never in
the temp folder, where two commands with different TMPDIRs (two shells, a container and its host) took two locks
for one folder and both measured.

The flock dies with its process, so a killed holder never leaves a stale lock (its file may stay; the
next holder takes it over). The file is removed when its holder lets go, so a finished command leaves
no lock files behind (issue 44: every run left two in the temp folder). Removing it races with a
process that opened the file just before: that one may then lock a file no path names any more while
another makes and locks a new one. So a lock counts only where the path still names the file locked;
else it is taken again on the file the path names now.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path


class Busy(Exception):
    """Another process holds the lock; `holder` is what its file says of it ("" before it wrote anything)."""

    def __init__(self, holder: str):
        super().__init__(holder or "another process")
        self.holder = holder


def _names(path: Path, fd: int) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def take(path: str | Path, holder: str) -> int:
    """An open descriptor holding the lock on `path`, the file now saying `holder`; Busy where another
    process holds it."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            said = os.pread(fd, 200, 0).decode(errors="replace").strip()
            os.close(fd)
            raise Busy(said) from None
        if _names(Path(path), fd):
            os.ftruncate(fd, 0)
            os.pwrite(fd, holder.encode(), 0)
            return fd
        os.close(fd)           # let go and removed meanwhile: lock the file the path names now


def release(path: str | Path, fd: int) -> None:
    """Let go of a lock `take` gave: its file removed first (while still held, so nobody takes the removed
    file for the current one), then the descriptor closed with its flock."""
    with contextlib.suppress(OSError):       # gone already, or another user's file in a sticky folder
        if _names(Path(path), fd):
            os.unlink(path)
    os.close(fd)
