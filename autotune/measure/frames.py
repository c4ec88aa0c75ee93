"""Where a failure sits, as evidence a reader can open: a file relative to its package root and a
line. For an error, the frame that raised it; for a crash or a hang, the frame the worker was in,
from the stack its faulthandler writes on the fatal signal (the pool aborts a hung worker: SIGABRT)."""
from __future__ import annotations

import os
import re
import sys
import sysconfig
import traceback

_STDLIB = os.path.join(sysconfig.get_paths()["stdlib"], "")
_FRAME = re.compile(r'^\s+File "(.+)", line (\d+) in (\S+)', re.M)


def where(path: str, line: int) -> str:
    roots = [r for r in sys.path if r and path.startswith(os.path.join(r, ""))]
    if roots:
        return f"{os.path.relpath(path, max(roots, key=len))}:{line}"
    tail = re.split(r"[/\\](?:site|dist)-packages[/\\]", path)     # another environment's packages
    return f"{tail[-1] if len(tail) > 1 else os.path.basename(path)}:{line}"


def raised_at(exc: BaseException) -> str:
    """The innermost frame of the error it came from, when re-raised (an AttributeError means
    nothing without the line of SGLang that made it); '' when there is no traceback."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    frames = traceback.extract_tb(exc.__traceback__)
    return where(frames[-1].filename, frames[-1].lineno) if frames else ""


def _own(path: str) -> bool:
    """Not the standard library: time.sleep or subprocess.wait says little, their caller says why."""
    return not path.startswith(_STDLIB) or "-packages" in path


def stuck_at(dump: str) -> str:
    """'file:line in func' of the main thread's innermost frame outside the standard library, from
    faulthandler's text (threads newest first, so the main thread's block is the last); '' if none."""
    blocks = [b for b in re.split(r"^(?=(?:Current thread|Thread) 0x|Stack \()", dump, flags=re.M) if _FRAME.search(b)]
    if not blocks:
        return ""
    frames = [m.groups() for m in map(_FRAME.match, blocks[-1].splitlines()) if m]
    path, line, func = next((f for f in frames if _own(f[0])), frames[0])
    return f"{where(path, int(line))} in {func}"
