"""Every external program autotune starts (git for publish, nvidia-smi, SGLang's server and benchmarks for
validate) starts here, and only here.

- A clean, explicit environment: this process's, less every variable that would point the program at
  another target than its command line names. git reads GIT_DIR, GIT_WORK_TREE, GIT_INDEX_FILE and the
  rest before its own `-C`: a GIT_DIR left in a shell (or set by the hook that started autotune) sent
  publish's branch and commit into another repository while the serving repo got untracked files. Every
  GIT_* variable is dropped; what a program must be told is passed explicitly (`env=`), and git is told
  never to wait on a terminal prompt (publish runs unattended).
- The program is found on the PATH it will run with, and its path is named in its errors (which git
  failed matters where several are installed); none there is one line (ProgramMissing: bad input, exit 2).
- Credentials in a URL (`https://user:TOKEN@host/r.git`) are masked in what a program prints before it
  reaches any message (errors.mask_credentials; the CLI masks every line it prints the same way).
- A scratch folder made for a program (publish's clone) is removed whatever fails (`scratch`).
"""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from autotune.errors import UsageError, mask_credentials

# Variables a program inherits from no one: they redirect it to another target than its command line.
NOT_INHERITED = ("GIT_",)
# What git is told on every call: never wait for a password on the terminal (a hang, not an error).
GIT_SETTINGS = {"GIT_TERMINAL_PROMPT": "0"}


class ProgramMissing(UsageError):
    """The program is not on the PATH it would run with: one line, exit 2."""


def environment(overrides: Mapping[str, str | None] | None = None, base: Mapping[str, str] | None = None) -> dict:
    """The environment a program runs with: `base` (this process's) less NOT_INHERITED, then `overrides`
    (a value None removes the variable)."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if not k.startswith(NOT_INHERITED)}
    for k, v in (overrides or {}).items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = str(v)
    return env


def locate(name: str, env: Mapping[str, str]) -> str:
    """The program's path: `name` itself where it names a file, else found on env's PATH."""
    if os.sep in name:
        return name
    found = shutil.which(name, path=env.get("PATH", ""))
    if found is None:
        path = env.get("PATH", "")
        raise ProgramMissing(f"{name} is not on PATH ({path[:200] or 'empty'}): install {name} or put its folder "
                             "on PATH")
    return found


@dataclass(frozen=True)
class Finished:
    """A program that ran: its output (credentials masked) and how it ended."""
    program: str           # the path it ran from
    returncode: int
    stdout: str
    stderr: str

    def said(self) -> str:
        """What it said about its failure: stderr, else stdout."""
        return self.stderr.strip() or self.stdout.strip()


def run(argv: Sequence[str], *, cwd: str | Path | None = None, stdin: str | None = None,
        env: Mapping[str, str | None] | None = None, timeout: float | None = None) -> Finished:
    """Run a program to its end, its output captured; ProgramMissing where it is not on PATH."""
    full = environment({**(GIT_SETTINGS if Path(argv[0]).name == "git" else {}), **(env or {})})
    program = locate(argv[0], full)
    r = subprocess.run([program, *argv[1:]], cwd=cwd, input=stdin, env=full, capture_output=True, text=True,
                       errors="replace", timeout=timeout)
    return Finished(program, r.returncode, mask_credentials(r.stdout), mask_credentials(r.stderr))


def start(argv: Sequence[str], *, env: Mapping[str, str | None] | None = None, **popen) -> subprocess.Popen:
    """Start a program that runs beside us (a server, a benchmark): the same environment and lookup."""
    full = environment(env)
    return subprocess.Popen([locate(argv[0], full), *argv[1:]], env=full, **popen)


@contextlib.contextmanager
def scratch(prefix: str):
    """A private temporary folder for a program's work, removed when the block ends, however it ends."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
