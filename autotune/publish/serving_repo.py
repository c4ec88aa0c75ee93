"""The serving repo `autotune publish` commits into, through the plain git CLI (autotune.programs: a clean
environment, so git acts on this repo whatever GIT_* variables the shell holds).

A publish is one new branch holding one commit, or nothing. It holds the repo alone (`held`: a second
publish into it is refused in one line), every check runs before the branch is made, and each step that
changes the repo registers its undo before it runs (`Steps`): a step can fail halfway (`checkout -b`
makes the branch, then the repo's post-checkout hook exits 1). On any failure after that (a write, a hook,
a Ctrl-C) the undos run in reverse order, with the repo's hooks off: the same branch checked out, every
file it wrote as it was, no file or folder it made, no branch.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
from pathlib import Path
from typing import Callable, Iterable, Mapping

from autotune import programs
from autotune.fileio.writing import write_bytes

# The undo steps run with the repo's hooks off: a hook that failed the step must not fail its undo too.
NO_HOOKS = ("-c", "core.hooksPath=/dev/null")


class PublishError(ValueError):
    pass


def _git(repo: Path, args: tuple, stdin: str | None = None, hooks: bool = True) -> programs.Finished:
    return programs.run(["git", *(() if hooks else NO_HOOKS), "-C", str(repo), *args], stdin=stdin)


def _failed(repo: Path, args: tuple, r: programs.Finished) -> PublishError:
    # named by its subcommand: the arguments can be a whole commit message
    command = next((a for a in args if not a.startswith("-") and "=" not in a), "")
    return PublishError(f"git {command} failed in {repo} ({r.program}): {r.said()}")


def git(repo: Path, *args: str, hooks: bool = True) -> str:
    r = _git(repo, args, hooks=hooks)
    if r.returncode != 0:
        raise _failed(repo, args, r)
    return r.stdout.strip()


def _git_z(repo: Path, *args: str, stdin: str | None = None, ok=(0,)) -> list[str]:
    """A git command's NUL-separated output (paths as git holds them: no quoting)."""
    r = _git(repo, args, stdin=stdin)
    if r.returncode not in ok:
        raise _failed(repo, args, r)
    return [x for x in r.stdout.split("\0") if x]


def git_dir(repo: Path) -> Path:
    """The repository's own store (`.git`, or where a worktree's or a `.git` file's points)."""
    return (repo / git(repo, "rev-parse", "--git-common-dir")).resolve()


@contextlib.contextmanager
def held(repo: Path):
    """The serving repo held by this publish alone while the block runs: an flock on its git folder (no
    file is made for it; the lock goes with the process). A second publish is refused in one line (it
    found the first one's files half written and called them not autotune's)."""
    where = git_dir(repo)
    fd = os.open(where, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            raise PublishError(f"another autotune publish holds {repo} (it is writing its branch now): wait for it "
                               "to finish, then publish again") from None
        yield
    finally:
        os.close(fd)


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


class Steps:
    """What publish did to the serving repo, each step's undo registered before the step runs; `undo()`
    runs them in reverse order, each best effort (the error that got us there is the one reported)."""

    def __init__(self):
        self.undos: list[Callable[[], None]] = []

    def step(self, undo: Callable[[], None], do: Callable[[], object] = lambda: None):
        self.undos.append(undo)
        return do()

    def undo(self) -> None:
        for undo in reversed(self.undos):
            with contextlib.suppress(Exception):
                undo()
        self.undos.clear()


@contextlib.contextmanager
def new_branch(repo: Path, branch: str, paths: Iterable[Path]):
    """Within: `branch` made from HEAD and checked out. Where the block (or the checkout itself, its hook
    included) raises, the repo is put back (see the module doc); `paths`: every file the block may write."""
    paths = list(paths)
    head, born = _head(repo)
    before = {p: p.read_bytes() if p.is_file() else None for p in paths}
    folders = _folders_made(repo, paths)
    steps = Steps()
    try:
        steps.step(lambda: _back_to(repo, branch, head, born), lambda: git(repo, "checkout", "-q", "-b", branch))
        steps.step(lambda: _restore(before, folders))        # the block's writes, its add and its commit
        yield
    except BaseException:
        steps.undo()
        raise


def _restore(before: dict, folders: list) -> None:
    """Every file as it was (None: there was none), then the folders writing them made."""
    for path, data in before.items():
        with contextlib.suppress(OSError, ValueError):
            if data is None:
                path.unlink(missing_ok=True)
            elif not path.is_file() or path.read_bytes() != data:
                write_bytes(path, data)
    for folder in folders:
        with contextlib.suppress(OSError):
            folder.rmdir()


def _back_to(repo: Path, branch: str, head: str, born: bool) -> None:
    """HEAD, the index and the tracked files as they were, and `branch` gone (made or not)."""
    steps = ([["checkout", "-q", "-f", head]] if born else
             [["symbolic-ref", "HEAD", f"refs/heads/{head}"], ["read-tree", "--empty"]])
    for args in [*steps, ["branch", "-q", "-D", branch]]:
        with contextlib.suppress(PublishError, programs.ProgramMissing):
            git(repo, *args, hooks=False)
