"""One holder at a time of a thing on disk (a tuned folder, a run name of a SQLite storage): an flock on a
lock file next to the thing itself, removed by its holder when done.

Next to the thing, not in the temp folder: two commands with different TMPDIRs (two shells, a container
and its host) took two locks for one folder, both measured, and the loser's change was left aside. The
lock dies with its process (a killed holder leaves a file nobody holds: the next one takes it). The
holder removes the file while it still holds it; a process that opened the file just before must not
then hold a lock nobody else can see, so a lock is only taken on the file the name still names.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path


class Busy(RuntimeError):
    """Another process holds the lock; the text is what it wrote there (`pid N`)."""


def acquire(path: Path) -> int:
    """Hold the lock file `path` (made where missing, in a folder that exists); Busy where another
    process holds it. Returns the descriptor to `release`."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise Busy(holder) from None
        try:
            here, named = os.fstat(fd), os.stat(path)
            current = (here.st_dev, here.st_ino) == (named.st_dev, named.st_ino)
        except FileNotFoundError:
            current = False
        if current:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()}".encode(), 0)
            return fd
        os.close(fd)             # its holder removed it meanwhile: take the one the name names now


def release(fd: int, path: Path) -> None:
    """Remove the lock file, then let the lock go (in that order: see the module doc)."""
    with contextlib.suppress(OSError):
        os.unlink(path)
    os.close(fd)
