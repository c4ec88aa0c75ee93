"""Atomic file writes: nothing already on disk is damaged by a failed or interrupted run."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def write_atomic(path: str | Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def write_json(path: str | Path, obj, indent: int = 4) -> None:
    write_atomic(path, json.dumps(obj, indent=indent) + "\n")


def read_json(path: str | Path, default=None):
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        return default


def check_writable(folder: str | Path) -> None:
    """Raise OSError with a clear message when `folder` cannot be created or written."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".autotune-write-test.", dir=folder)
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        raise OSError(f"output folder {folder} is not writable: {e.strerror or e}") from None
