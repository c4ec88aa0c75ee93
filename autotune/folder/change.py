"""A tuned folder changes as one.

A run writes many files into `<out>/<device>/`: two config files and a provenance entry per problem,
the shipped overlay's copies, server_args.yaml, backend_choice.json, FlashInfer's cache and blocklist.
SGLang reads the folder as a whole, so it must never see part of a change: a failure halfway (a full
disk, a refused file, a crash) would otherwise leave a new gate_up file beside an old down file and a
provenance that vouches for neither.

So a command that writes into a tuned folder holds a `FolderChange` on it:
- one writer at a time: an flock on `<out>/.<device>.autotune-lock`, next to the folder (autotune.fileio.locks:
  two commands with different TMPDIRs must meet on one lock), taken before anything is measured (a second
  run into the same folder is refused in one line, exit 2) and removed when the change ends; the lock
  dies with its process;
- a folder that cannot be changed as a whole (immutable, write-protected: fileio.writing.tree_problem) is
  refused when it is locked, before anything is staged;
- the change is staged whole in a copy beside the folder (`<out>/.<device>.staged-<pid>`, same file
  system), and every path of the folder is read and written there (the folder's handle,
  autotune.folder.tuned.TunedFolder, names it and holds the change);
- at the end the staged copy is swapped in by one rename (Linux's renameat2 RENAME_EXCHANGE; where the
  file system refuses it, two renames), and the old copy removed. A change that failed anywhere is
  thrown away instead: the folder is byte-identical to what it was.
- a folder changed by someone else while the run measured (a hand edit, a copy) is not swapped over:
  the change is kept aside and said, never silently dropped or merged.
"""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import shutil
from pathlib import Path

from autotune.fileio import locks
from autotune.fileio.writing import WriteError, tree_problem
from autotune.store.run_lock import RunLocked

RENAME_EXCHANGE = 2
AT_FDCWD = -100


def _key(folder: str | Path) -> Path:
    folder = Path(folder)
    return folder.parent.resolve() / folder.name


class FolderChange:
    """One change of one tuned folder: locked when made, staged on `begin`, swapped in on `commit`."""

    def __init__(self, folder: str | Path, vouch=None):
        self.folder = _key(folder)
        self.given = Path(folder)              # as the user named it: what messages show
        # called on the staged change before it is swapped in (the folder's handle records every file's
        # sha256 in its provenance); None: nothing recorded (validate's outputs)
        self.vouch = vouch
        self.lock_path = self.folder.parent / f".{self.folder.name}.autotune-lock"
        self.staging: Path | None = None
        self.failed: str | None = None
        self._fd: int | None = None
        self._existed = False
        self._made: list[Path] = []           # the folders above it this change made: removed again if left empty
        self._before: dict | None = None
        self.outcome: str | None = None      # after the change: why nothing changed, if so
        self.swapped = False                 # after the change: whether the folder now holds it

    # -- one writer ------------------------------------------------------------------------------
    def lock(self) -> "FolderChange":
        why = tree_problem(self.folder)
        if why:
            raise WriteError(f"{self.given} cannot be changed: {why} (make it writable, or write elsewhere)")
        self._made = [p for p in (self.folder.parent, *self.folder.parent.parents) if not p.exists()]
        try:
            self.folder.parent.mkdir(parents=True, exist_ok=True)
            self._fd = locks.take(self.lock_path, f"pid {os.getpid()}")
        except locks.Busy as e:
            self._remove_made()
            raise RunLocked(f"another autotune command ({e}) is writing into {self.given}; wait for it to "
                            "finish, or write into another --out") from None
        except OSError as e:
            self._remove_made()
            raise WriteError(f"{self.given} cannot be changed: {e.strerror or e} (its lock "
                             f"{self.lock_path.name} cannot be made beside it)") from None
        for stale in self.folder.parent.glob(f".{self.folder.name}.staged-*"):   # a killed writer's
            shutil.rmtree(stale, ignore_errors=True)
        return self

    def release(self) -> None:
        if self.staging is not None:
            shutil.rmtree(self.staging, ignore_errors=True)
            self.staging = None
        if self._fd is not None:
            locks.release(self.lock_path, self._fd)       # the flock goes with it, and its file
            self._fd = None
        self._remove_made()

    def _remove_made(self) -> None:
        """Nothing went in: the command leaves no empty output folder it made."""
        for folder in self._made:
            with contextlib.suppress(OSError):
                folder.rmdir()
        self._made = []

    # -- staging ---------------------------------------------------------------------------------
    def begin(self) -> Path:
        """Stage a copy of the folder as it is now; from here every path of the folder means the copy."""
        if self.staging is not None:
            return self.staging
        staging = self.folder.parent / f".{self.folder.name}.staged-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        self._existed = self.folder.is_dir()
        if self._existed:
            shutil.copytree(self.folder, staging, symlinks=True)
        else:
            staging.mkdir(parents=True)
        self._before = manifest(self.folder)
        self.staging = staging
        return staging

    def in_words(self, text: str) -> str:
        """A message with the staged copy's path as the folder's own (what the user knows)."""
        return text.replace(str(self.staging), str(self.given)) if self.staging is not None else text

    def fail(self, why: str) -> None:
        """A write of the change failed: the change is thrown away at the end, whatever else succeeds."""
        self.failed = self.failed or why

    def commit(self) -> str | None:
        """Swap the staged change in; returns why it was not (the folder then is as it was)."""
        if self.staging is None:
            return None
        if self.failed:
            return f"nothing in {self.given} changed: {self.failed}"
        if not _differs(self.folder, self.staging):
            return None
        if self.vouch is not None:
            try:
                self.vouch()
            except OSError as e:
                return f"nothing in {self.given} changed: {self.in_words(str(e))}"
        now = manifest(self.folder)
        if now != self._before:
            aside = self.folder.parent / f"{self.folder.name}.autotune-change-{os.getpid()}"
            os.rename(self.staging, aside)
            self.staging = None
            return (f"{self.given} was changed by another hand while this run measured: not replaced; "
                    f"this run's change is in {aside} (compare and move it in, or run again)")
        _swap(self.staging, self.folder, self._existed)
        _fsync_dir(self.folder.parent)
        self.swapped = True
        return None


def _swap(new: Path, folder: Path, existed: bool) -> None:
    if not existed:
        os.rename(new, folder)          # fails where a folder appeared meanwhile: nothing lost
        return
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    fn = getattr(libc, "renameat2", None)
    if fn is not None and fn(AT_FDCWD, os.fsencode(new), AT_FDCWD, os.fsencode(folder), RENAME_EXCHANGE) == 0:
        # now the old copy; the change is in whatever happens to it (one left behind: the next lock clears it)
        shutil.rmtree(new, ignore_errors=True)
        return
    err = ctypes.get_errno() if fn is not None else errno.ENOSYS
    if err not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, 0):
        raise OSError(err, f"cannot swap {new} into {folder}: {os.strerror(err)}")
    old = folder.parent / f".{folder.name}.old-{os.getpid()}"
    os.rename(folder, old)              # the file system has no exchange: two renames, the old kept until
    try:                                # the new one is in place
        os.rename(new, folder)
    except OSError:
        os.rename(old, folder)
        raise
    shutil.rmtree(old, ignore_errors=True)


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def manifest(folder: Path) -> dict:
    """Every entry under the folder by relative path: (kind, size, mtime_ns) - what changes when anyone
    writes there."""
    if not folder.is_dir():
        return {}
    out = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            p = Path(root) / name
            st = p.lstat()
            out[str(p.relative_to(folder))] = (st.st_mode >> 12, st.st_size, st.st_mtime_ns)
    return out


def _differs(a: Path, b: Path) -> bool:
    """Whether the two trees differ in any file's name or bytes (a run that wrote the same bytes
    changes nothing)."""
    return (folder_sha256(a, outputs_aside=False) if a.is_dir() else {}) != folder_sha256(b, outputs_aside=False)


# What `autotune validate` writes into a folder it judged (its record names the folder's other files' bytes)
VALIDATION_JSON, PLOT_PNG, REPORT_MD = "validation.json", "validation.png", "report.md"
VALIDATE_OUTPUTS = (VALIDATION_JSON, REPORT_MD, PLOT_PNG)
RAW_RUNS = "validation_runs"          # `validate --engine sglang` keeps its raw results there


def folder_sha256(folder: str | Path, outputs_aside: bool = True) -> dict[str, str]:
    """{path in the folder (with /): sha256} of every regular file; `outputs_aside`: validate's own
    outputs left out. Links to folders are not followed (what they hold is not the folder's)."""
    import hashlib

    from autotune.fileio.reading import read_bytes

    root = Path(folder)
    out = {}
    for here, dirs, files in os.walk(root):
        rel_here = Path(here).relative_to(root)
        if outputs_aside and rel_here == Path("."):
            dirs[:] = [d for d in dirs if d != RAW_RUNS]
            files = [f for f in files if f not in VALIDATE_OUTPUTS]
        for name in files:
            path = Path(here) / name
            if path.is_file():
                out[(rel_here / name).as_posix()] = hashlib.sha256(read_bytes(path)).hexdigest()
    return dict(sorted(out.items()))
