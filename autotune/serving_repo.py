"""The serving repo `autotune publish` commits into, through the plain git CLI.

A publish is one new branch holding one commit, or nothing: every check runs before the branch is
made, and a failure after it (a write, a commit hook, a Ctrl-C) puts the repo back as it was found:
the same branch checked out, every file it wrote as it was, no file or folder it made, no branch.
"""
from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path
from typing import Iterable

from .fsutil import write_bytes


class PublishError(ValueError):
    pass


def git(repo: Path, *args: str) -> str:
    r = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if r.returncode != 0:
        # named by its subcommand: the arguments can be a whole commit message
        command = next((a for a in args if not a.startswith("-") and "=" not in a), "")
        raise PublishError(f"git {command} failed in {repo}: {r.stderr.strip() or r.stdout.strip()}")
    return r.stdout.strip()


def is_url(target: str) -> bool:
    return "://" in target or target.startswith("git@") or target.endswith(".git")


def _head(repo: Path) -> tuple[str, bool]:
    """What HEAD is (a branch name, else a commit when detached), and whether it has a commit yet."""
    try:
        head = git(repo, "symbolic-ref", "-q", "--short", "HEAD")
    except PublishError:
        head = git(repo, "rev-parse", "HEAD")
    try:
        git(repo, "rev-parse", "-q", "--verify", "HEAD")
        return head, True
    except PublishError:
        return head, False


def _folders_made(repo: Path, paths: Iterable[Path]) -> list[Path]:
    """The folders writing `paths` would create (deepest first)."""
    made = {p for path in paths for p in path.parents if not p.exists() and repo in p.parents}
    return sorted(made, key=lambda p: len(p.parts), reverse=True)


@contextlib.contextmanager
def new_branch(repo: Path, branch: str, paths: Iterable[Path]):
    """Within: `branch` made from HEAD and checked out. Where the block raises, the repo is put back
    (see the module doc); `paths`: every file the block may write."""
    paths = list(paths)
    head, born = _head(repo)
    before = {p: p.read_bytes() if p.is_file() else None for p in paths}
    folders = _folders_made(repo, paths)
    git(repo, "checkout", "-q", "-b", branch)
    try:
        yield
    except BaseException:
        _put_back(repo, branch, head, born, before, folders)
        raise


def _put_back(repo: Path, branch: str, head: str, born: bool, before: dict, folders: list) -> None:
    """Best effort, step by step: the error that got us here is the one reported."""
    for path, data in before.items():
        with contextlib.suppress(OSError, ValueError):
            if data is None:
                path.unlink(missing_ok=True)
            elif not path.is_file() or path.read_bytes() != data:
                write_bytes(path, data)
    for folder in folders:
        with contextlib.suppress(OSError):
            folder.rmdir()
    steps = ([["checkout", "-q", "-f", head]] if born else
             [["symbolic-ref", "HEAD", f"refs/heads/{head}"], ["read-tree", "--empty"]])
    for args in [*steps, ["branch", "-q", "-D", branch]]:
        with contextlib.suppress(PublishError):
            git(repo, *args)
