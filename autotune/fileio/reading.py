"""The one reader of the files a user hands us (model configs, search spaces, recordings, tuned folders,
provenance, choices): what fsutil is to writing.

- Regular files only: a FIFO, a device or a socket named as an input would block the read forever or
  feed it a stream, so it is refused before it is opened (`NotARegularFile`, an OSError every
  reader's `except OSError` already turns into its one line).
- Parsed without a traceback whatever the nesting: a document nested deeper than the parser's
  recursion allows is a parse error of its format (json.JSONDecodeError, yaml.YAMLError), caught
  where that format's errors are.
"""
from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path

import yaml


class NotARegularFile(OSError):
    pass


def require_regular(path: str | Path) -> Path:
    """`path` when it is a regular file (or a link to one); FileNotFoundError, IsADirectoryError or
    NotARegularFile otherwise, without opening it."""
    p = Path(path)
    mode = os.stat(p).st_mode
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, "is a folder, not a file", str(p))
    if not stat.S_ISREG(mode):
        raise NotARegularFile(errno.EINVAL, "is not a regular file (a FIFO, a device or a socket)", str(p))
    return p


def read_text(path: str | Path) -> str:
    return require_regular(path).read_text()


def read_bytes(path: str | Path) -> bytes:
    return require_regular(path).read_bytes()


def parse_json(data: str | bytes):
    try:
        return json.loads(data)
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply to read", "", 0) from None


def parse_yaml(text: str):
    try:
        return yaml.safe_load(text)
    except RecursionError:
        raise yaml.YAMLError("nested too deeply to read") from None


def load_json(path: str | Path):
    """A regular file's JSON (FileNotFoundError, NotARegularFile, json.JSONDecodeError or
    UnicodeDecodeError otherwise)."""
    return parse_json(read_bytes(path))


def first_error(model, doc) -> str | None:
    """What a pydantic schema finds wrong with `doc`, as one line naming where (None: nothing)."""
    from pydantic import ValidationError

    try:
        model.model_validate(doc)
    except ValidationError as e:
        err = e.errors()[0]
        loc = [str(p) for p in err["loc"]]
        loc = loc[:-2] if loc[-1:] == ["[key]"] else loc      # a bad key: its message names it
        return f"{'.'.join(loc) or 'it'}: {err['msg'].removeprefix('Value error, ')}"
    return None
