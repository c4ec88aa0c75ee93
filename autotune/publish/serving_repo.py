"""The serving repo `autotune publish` commits into, through the plain git CLI.

A publish is one new branch holding one commit, or nothing: every check runs before the branch is
made, and a failure after it (a write, a commit hook, a Ctrl-C) puts the repo back as it was found:
the same branch checked out, every file it wrote as it was, no file or folder it made, no branch.
"""
from __future__ import annotations

import contextlib
import hashlib
import subprocess
from pathlib import Path
from typing import Iterable, Mapping

from autotune.fileio.writing import write_bytes


class PublishError(ValueError):
    pass


def git(repo: Path, *args: str) -> str:
    r = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if r.returncode != 0:
        # named by its subcommand: the arguments can be a whole commit message
        command = next((a for a in args if not a.startswith("-") and "=" not in a), "")
        raise PublishError(f"git {command} failed in {repo}: {r.stderr.strip() or r.stdout.strip()}")
    return r.stdout.strip()


def _git_z(repo: Path, *args: str, stdin: str | None = None, ok=(0,)) -> list[str]:
    """A git command's NUL-separated output (paths as git holds them: no quoting)."""
    r = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, input=stdin, text=True)
    if r.returncode not in ok:
        raise PublishError(f"git {args[0]} failed in {repo}: {r.stderr.strip() or r.stdout.strip()}")
    return [x for x in r.stdout.split("\0") if x]


def _shown(paths: list[str], most: int = 3) -> str:
    return ", ".join(paths[:most]) + (f" and {len(paths) - most} more" if len(paths) > most else "")


def refuse_ignored(repo: Path, paths: Iterable[Path]) -> None:
    """Before anything is written: none of the files to commit is one the serving repo's ignore rules
    keep out (`git add` skips an ignored file without a word: the commit would hold less than planned)."""
    rels = [p.relative_to(repo).as_posix() for p in paths]
    # -v -z: source, line, pattern, path per ignored path; exit 1 where none is ignored
    out = _git_z(repo, "check-ignore", "-v", "-z", "--stdin", stdin="\0".join(rels) + "\0", ok=(0, 1))
    hits = [out[i:i + 4] for i in range(0, len(out) - 3, 4)]
    if hits:
        source, line, pattern, _ = hits[0]
        raise PublishError(f"the serving repo ignores {len(hits)} of the {len(rels)} files to publish "
                           f"({_shown([h[3] for h in hits])}; {source}:{line}: {pattern}): git would commit "
                           "only the others; not publishing (let the repo track them, or name another --path)")


def _blob_id(data: bytes, object_format: str) -> str:
    """The id git gives a blob of these bytes (its object format: sha1 or sha256)."""
    return hashlib.new(object_format, b"blob %d\0" % len(data) + data).hexdigest()


def prove_committed(repo: Path, files: Mapping[Path, tuple]) -> None:
    """The commit at HEAD holds every planned file (`files`: path -> (bytes, ...)) with exactly its
    planned bytes, and changes nothing else; PublishError naming what differs otherwise."""
    try:
        fmt = git(repo, "rev-parse", "--show-object-format")
    except PublishError:
        fmt = "sha1"                               # a git from before sha256 repositories
    planned = {p.relative_to(repo).as_posix(): _blob_id(data, fmt) for p, (data, *_) in files.items()}
    tree = {}
    for entry in _git_z(repo, "ls-tree", "-r", "-z", "HEAD"):
        meta, path = entry.split("\t", 1)
        tree[path] = meta.split()[2]
    changed = _git_z(repo, "diff-tree", "-r", "-z", "--root", "--no-commit-id", "--name-only", "HEAD")
    missing = [p for p in planned if p not in tree]
    other = [p for p in planned if p in tree and tree[p] != planned[p]]
    extra = [p for p in changed if p not in planned]
    problems = []
    if missing:
        problems.append(f"{len(missing)} of the {len(planned)} planned files are not in it ({_shown(missing)})")
    if other:
        problems.append(f"{_shown(other)} hold other bytes than planned (a filter or attribute of the serving repo)")
    if extra:
        problems.append(f"it also changes {_shown(extra)}, which publish did not plan")
    if problems:
        raise PublishError("the commit is not what publish planned: " + "; ".join(problems)
                           + "; the serving repo is put back as it was")


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
