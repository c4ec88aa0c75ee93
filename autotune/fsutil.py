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


def save_figure(fig, path: str | Path) -> None:
    """A matplotlib figure as a PNG, atomically (a half-written plot never replaces a good one)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".png", dir=path.parent)
    os.close(fd)
    try:
        fig.savefig(tmp, format="png")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: str | Path, obj, indent: int = 4) -> None:
    write_atomic(path, json.dumps(obj, indent=indent) + "\n")


class FileFormatError(ValueError):
    """A file we read is not what it should be (the CLI says so in one line, exit 2)."""


def read_json(path: str | Path, default=None):
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        return default
    except IsADirectoryError:
        raise FileFormatError(f"{path} is a folder, not a JSON file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise FileFormatError(f"{path}: not valid JSON ({e}); fix or remove it") from None


def check_writable(folder: str | Path) -> None:
    """Raise OSError with a clear message when `folder` cannot be created or written."""
    folder = Path(folder)
    # Tried in the nearest folder that exists: nothing is created before something is written
    # (a run that stops at a bad input must not leave an empty tuned_configs/ behind).
    probe = folder
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    try:
        if not probe.is_dir():
            raise NotADirectoryError(20, "a file is in the way" if probe == folder else f"{probe} is a file")
        fd, tmp = tempfile.mkstemp(prefix=".autotune-write-test.", dir=probe)
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        raise OSError(f"output folder {folder} is not writable: {e.strerror or e}") from None
