"""The one writer: every file autotune writes goes through this module.

- Atomic: a temp file beside the target, written, fsynced, then renamed over it (a crash, a full
  disk or a Ctrl-C leaves the old file or the new one, never half of one), copies included.
- Mode 0666 less the umask (0644 under the usual 022), as a plain `open()` would make it: an
  SGLang server running as another user can read what we wrote (mkstemp alone gives 0600).
- Never over a file autotune did not write: each write names what "ours" means for its file
  (listed in the folder's provenance, or in our own format), and a file there that is not ours is
  refused in one line (`NotOurs`, exit 2) unless `--force` (`forcing`). Commands call
  `claim` on their outputs before measuring anything, so a refusal costs no device time.
"""
from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Callable, Iterable

from autotune.fileio.reading import load_json, read_bytes

Ours = Callable[[Path], bool]
Files = dict[Path, tuple[bytes, Ours | None]]      # planned in memory: path -> (content, what is ours there)

_FORCE: contextvars.ContextVar[bool] = contextvars.ContextVar("autotune_force", default=False)


class FileFormatError(ValueError):
    """A file we read is not what it should be (the CLI says so in one line, exit 2)."""


class NotOurs(FileFormatError):
    """A write would replace a file autotune did not write (one line, exit 2)."""


class WriteError(FileFormatError, OSError):
    """A write failed (a full disk, a folder made read-only): one line, and the old file stands."""


class Outside(FileFormatError):
    """A name read from a file would reach past the folder it names a file of (one line, exit 2)."""


@contextlib.contextmanager
def forcing(on: bool):
    """Within: files that are not ours may be replaced (`--force`)."""
    token = _FORCE.set(bool(on))
    try:
        yield
    finally:
        _FORCE.reset(token)


def forced() -> bool:
    """Whether --force is on (files that are not ours may be replaced)."""
    return _FORCE.get()


def _umask() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    old = os.umask(0o022)       # no /proc: read it the only portable way, and put it back at once
    os.umask(old)
    return old


def file_mode() -> int:
    return 0o666 & ~_umask()


# --- what is ours ---------------------------------------------------------------------------------

def _json_object(path: Path):
    try:
        doc = load_json(path)
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def json_with(*keys: str) -> Ours:
    """Ours: a JSON object holding every one of `keys` (the shape of one of our own formats)."""
    def ours(path: Path) -> bool:
        doc = _json_object(path)
        return doc is not None and all(k in doc for k in keys)
    return ours


def text_starting(prefix: str) -> Ours:
    def ours(path: Path) -> bool:
        try:
            with open(path, "rb") as f:
                return f.read(len(prefix.encode())) == prefix.encode()
        except OSError:
            return False
    return ours


def bytes_holding(marker: bytes) -> Ours:
    def ours(path: Path) -> bool:
        try:
            return marker in path.read_bytes()[:4096]
        except OSError:
            return False
    return ours


def listed(names: Iterable[str], root: str | Path) -> Ours:
    """Ours: a file whose path relative to `root` (the folder a provenance or a manifest describes)
    is one of `names`, exactly (matched by its end, `config.json` also claimed a user's `sub/config.json`)."""
    names, root = set(names), Path(root)

    def ours(path: Path) -> bool:
        try:
            return Path(path).relative_to(root).as_posix() in names
        except ValueError:
            return False
    return ours


ANY: Ours = lambda path: True     # noqa: E731  files in folders only autotune writes (its own cache)


def claim(path: str | Path, ours: Ours, what: str = "") -> None:
    """Refuse (NotOurs) where `path` holds something autotune would replace but did not write, or a file
    that cannot be replaced (write-protected, immutable); a folder in the way is refused whatever
    --force says."""
    path = Path(path)
    if path.is_dir():
        raise NotOurs(f"{what + ' ' if what else ''}{path} is a folder; name a file")
    if path.is_symlink() and not path.exists():
        raise NotOurs(f"{path} is a link to {os.readlink(path)}, which does not exist: not replaced (remove the link "
                      "or name another output)")
    if path.exists() and not path.is_file():
        raise NotOurs(f"{path} is not a regular file (a FIFO, a device or a socket): not replaced; name another output")
    if path.exists() and not _FORCE.get() and not ours(path):
        raise NotOurs(f"{path} is not a file autotune wrote{' (' + what + ')' if what else ''}: not replaced "
                      "(move it away, name another output, or pass --force)")
    why = path.exists() and change_problem(path)
    if why:
        raise NotOurs(f"{what + ' ' if what else ''}{path} {why}: not replaced (make it writable, or name another "
                      "output)")


def claim_all(targets: Iterable[tuple[str | Path, Ours]]) -> None:
    for path, ours in targets:
        claim(path, ours)


def inside(root: str | Path, rel: str) -> Path:
    """`root / rel`, refused (Outside) where it resolves outside `root` (a `..`, an absolute path, a
    link out of it): a name read from a file never writes or removes anything beyond its folder."""
    root, path = Path(root), Path(root) / rel
    if root.resolve() not in path.resolve().parents:
        raise Outside(f"{rel!r} names a file outside {root}: refused")
    return path


# --- writing --------------------------------------------------------------------------------------

@contextlib.contextmanager
def atomic_file(path: str | Path):
    """A binary file object that becomes `path` when the block ends without an error."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # the temporary name says whose it is, but never runs past the longest name a file may have
        prefix = f".{path.name}." if len(os.fsencode(path.name)) <= 200 else ".autotune-write."
        fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise WriteError(f"cannot write {path}: {e.strerror or e}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
            os.fchmod(f.fileno(), file_mode())
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(e, OSError):
            raise WriteError(f"cannot write {path}: {e.strerror or e}; what was there before is unchanged") from None
        raise
    with contextlib.suppress(OSError):          # the rename itself survives a power cut
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def write_bytes(path: str | Path, data: bytes, ours: Ours | None = None) -> None:
    if ours is not None:
        claim(path, ours)
    with atomic_file(path) as f:
        f.write(data)


def write_atomic(path: str | Path, text: str, ours: Ours | None = None) -> None:
    write_bytes(path, text.encode(), ours)


def json_bytes(obj, indent: int | None = 4) -> bytes:
    """A JSON file's content as write_json writes it (for a plan held in memory before writing)."""
    return (json.dumps(obj, indent=indent) + "\n").encode()


def write_json(path: str | Path, obj, indent: int | None = 4, ours: Ours | None = None) -> None:
    write_bytes(path, json_bytes(obj, indent), ours)


def claim_files(files: Files) -> None:
    """`claim` each file planned in memory (None: any file may be replaced, but never a folder, a
    FIFO or a dangling link)."""
    claim_all((path, ours or ANY) for path, (_, ours) in files.items())


def write_all(files: Files) -> None:
    """Files planned in memory: every one claimed before the first is written."""
    claim_files(files)
    for path, (data, _) in files.items():
        write_bytes(path, data)


def copy_file(src: str | Path, dst: str | Path, ours: Ours | None = None) -> None:
    """A copy is written like any file: atomic, our mode, never over a file that is not ours; its
    source is read as every input is (a FIFO is refused, never read)."""
    write_bytes(dst, read_bytes(src), ours)


PNG_MARK = "autotune"


def save_figure(fig, path: str | Path, ours: Ours | None = None) -> None:
    """A matplotlib figure as a PNG, atomically, marked as ours in its Software field."""
    if ours is not None:
        claim(path, ours)
    with atomic_file(path) as f:
        fig.savefig(f, format="png", metadata={"Software": PNG_MARK})


def sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# --- reading --------------------------------------------------------------------------------------

def read_json(path: str | Path, default=None):
    try:
        return load_json(path)
    except FileNotFoundError:
        return default
    except IsADirectoryError:
        raise FileFormatError(f"{path} is a folder, not a JSON file") from None
    except NotADirectoryError:
        raise FileFormatError(f"{path}: a file is in the way of its folder") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise FileFormatError(f"{path}: not valid JSON ({e}); fix or remove it") from None


# Linux's FS_IOC_GETFLAGS and the attributes that forbid every change, root's included (chattr +i, +a)
FS_IOC_GETFLAGS = 0x80086601
ATTRIBUTES = {0x10: "immutable (chattr +i)", 0x20: "append-only (chattr +a)"}


def _attributes(path: Path) -> int:
    """The file's attribute flags (0 where the file system keeps none)."""
    import fcntl
    import struct

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return 0
    try:
        return struct.unpack("i", fcntl.ioctl(fd, FS_IOC_GETFLAGS, b"\0" * 8)[:4])[0]
    except OSError:                 # a file system without attributes (tmpfs, NFS): none set
        return 0
    finally:
        os.close(fd)


def _attribute_problem(path: Path) -> str | None:
    flags = _attributes(path)
    return next((f"is {what}" for bit, what in ATTRIBUTES.items() if flags & bit), None)


def change_problem(path: str | Path) -> str | None:
    """Why this process cannot replace `path` (a file) or change what it holds (a folder), None where it
    can: an immutable or append-only attribute, or no write permission (a folder also needs search)."""
    path = Path(path)
    why = _attribute_problem(path)
    if why:
        return why
    if not os.access(path, os.W_OK | (os.X_OK if path.is_dir() else 0)):
        return "is write-protected (no write permission for this user)"
    return None


def tree_problem(folder: str | Path) -> str | None:
    """Why a folder cannot be changed as one (staged beside it, each file replaced there as `claim` allows,
    swapped in, the old copy removed), None where it can: the first entry in the way, and why."""
    folder = Path(folder)
    if not folder.is_dir():
        return None
    why = change_problem(folder)
    if why:
        return f"{folder} {why}"
    for here, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = Path(here) / name
            why = None if path.is_symlink() else change_problem(path)
            if why:
                return f"{path} {why}"
    return None


# A file system's most bytes in a path (Linux's PATH_MAX), and the least free space an output is
# written to (a run's summary and recording are kilobytes to megabytes: less than this is a full disk).
PATH_MAX = 4096
MIN_FREE = 1 << 20


def _nearest_existing(path: Path) -> Path:
    probe = path
    while not os.path.lexists(probe) and probe.parent != probe:
        probe = probe.parent
    return probe


def name_problem(path: str | Path) -> str | None:
    """Why the file system cannot hold a file or folder named `path` (None: it can): a part longer
    than a name there may be, or the whole longer than a path."""
    path = Path(os.path.abspath(path))
    try:
        most = os.pathconf(_nearest_existing(path), "PC_NAME_MAX")
    except (OSError, ValueError):
        most = 255
    long = next((part for part in path.parts if len(os.fsencode(part)) > most), None)
    if long is not None:
        return (f"names a file or folder {long[:40]!r}... of {len(os.fsencode(long))} bytes, above the {most} a name "
                "may have here")
    if len(os.fsencode(str(path))) >= PATH_MAX:
        return f"is {len(os.fsencode(str(path)))} bytes long, above the {PATH_MAX - 1} a path may have"
    return None


def check_writable(folder: str | Path) -> None:
    """Raise OSError with a clear message when `folder` cannot be created or written."""
    folder = Path(folder)
    if not str(folder).strip():
        raise OSError("an output folder must be named (got an empty path)")
    # Tried in the nearest folder that exists: nothing is created before something is written
    # (a run that stops at a bad input must not leave an empty tuned_configs/ behind).
    why = name_problem(folder)
    if why:
        raise OSError(f"output folder {folder} {why}")
    probe = _nearest_existing(folder)
    try:
        if not probe.is_dir():
            raise NotADirectoryError(20, "a file is in the way" if probe == folder else f"{probe} is a file")
        fd, tmp = tempfile.mkstemp(prefix=".autotune-write-test.", dir=probe)
        os.close(fd)
        os.unlink(tmp)
        disk = os.statvfs(probe)
    except OSError as e:
        raise OSError(f"output folder {folder} is not writable: {e.strerror or e}") from None
    free = disk.f_bavail * disk.f_frsize
    full = disk.f_files > 0 and disk.f_favail == 0       # no file may be made (where files are counted)
    if free < MIN_FREE or full:
        raise OSError(f"output folder {folder} is on a full disk ({free // 1024} KiB free"
                      f"{', no file may be added' if full else ''}): free some space first")
