"""What a `--storage` URL names, read by the libraries that open it: SQLAlchemy's URL parser
(`make_url`), its SQLite dialect (which options go to the driver, which file name SQLite is given)
and SQLite's own URI rules (`file:` names, `mode=`, `immutable=`). Every check of a storage (the
file's tables, the outputs that must not collide with it, the run lock, "held in memory") works on
the file named here, the one SQLite opens, never on a slice of the text: `sqlite:///mine.db?timeout=30`
is the file mine.db with a 30 s lock timeout, and `?mode=ro` is a database that cannot hold a run.

A query option the driver would drop in silence (`sqlite:///x.db?mode=ro` without `uri=true`), a
repeated one, or a value the driver refuses is one line here, before anything is opened or created.
"""
from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

# The query options SQLAlchemy's SQLite dialect passes to the driver as they are (isolation_level it
# drops), and the parameters SQLite reads from a URI file name (https://sqlite.org/uri.html).
DRIVER_OPTIONS = ("timeout", "detect_types", "check_same_thread", "cached_statements", "uri")
URI_PARAMETERS = ("mode", "immutable", "cache", "vfs", "psow", "nolock", "modeof")
_READ_ONLY_MODES = ("ro",)


class StorageUrlError(ValueError):
    pass


@dataclass(frozen=True)
class StorageTarget:
    url: str                      # as given (passwords masked where it is printed: storage.safe_url)
    backend: str                  # SQLAlchemy's backend name: sqlite, postgresql, ...
    file: Path | None = None      # the SQLite database file, as SQLite opens it; None: in memory, or a server
    in_memory: bool = False       # a SQLite database that lives and dies with the process
    read_only: str | None = None  # why it cannot be written (`mode=ro`, `immutable=1`), or None
    creates: bool = True          # SQLite creates the file where it is missing (not under mode=rw)

    @property
    def sqlite(self) -> bool:
        return self.backend == "sqlite"


def parse(url: str) -> StorageTarget:
    """The storage `url` names; StorageUrlError (one line, the URL's password parts masked) when
    SQLAlchemy cannot read it or SQLite would not open what it seems to say."""
    try:
        return _parse(url)
    except StorageUrlError as e:
        raise StorageUrlError(scrub(" ".join(str(e).split()), url)) from None


def _parse(url: str) -> StorageTarget:
    from sqlalchemy import exc
    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(url)
        backend = parsed.get_backend_name()
    except (exc.ArgumentError, ValueError, TypeError) as e:
        raise StorageUrlError(f"is not a database URL ({_first_line(e)}): write it as sqlite:///FILE.db or "
                              "postgresql://USER@HOST/DB") from None
    if backend != "sqlite":
        return StorageTarget(url, backend)
    return _sqlite(url, parsed)


def _sqlite(url: str, parsed) -> StorageTarget:
    from sqlalchemy import exc

    repeated = sorted(k for k, v in parsed.query.items() if isinstance(v, tuple))
    if repeated:
        raise StorageUrlError(f"gives its option {repeated[0]} more than once: give each once")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", exc.SAWarning)   # what it drops is refused below
            (filename,), options = parsed.get_dialect()().create_connect_args(parsed)
    except (exc.ArgumentError, exc.NoSuchModuleError, ValueError, TypeError) as e:
        raise StorageUrlError(f"is not a SQLite URL SQLAlchemy opens ({_first_line(e)})") from None
    uri = bool(options.get("uri"))
    if filename is None:               # sqlite://?uri=true: SQLAlchemy hands the driver no name at all
        raise StorageUrlError("names no database file: write sqlite:///FILE.db (or sqlite:// for one held in memory)")
    # What SQLAlchemy's SQLite dialect passes on neither to the driver nor into a URI file name is
    # dropped in silence (a warning at most), and SQLite ignores URI parameters it does not know.
    dropped = sorted(set(parsed.query) - set(options) - (set(URI_PARAMETERS) if uri else set()))
    if dropped:
        hint = (f"SQLite reads {dropped[0]} only from a URI file name: sqlite:///file:NAME.db?{dropped[0]}=...&uri=true"
                if dropped[0] in URI_PARAMETERS else
                f"SQLite's driver takes {', '.join(DRIVER_OPTIONS)}; its URI file names (uri=true) "
                f"{', '.join(URI_PARAMETERS)}")
        raise StorageUrlError(f"has option(s) {', '.join(dropped)} that would be ignored ({hint})")
    if not uri:
        if (parsed.database or "").lower().startswith("file:"):
            raise StorageUrlError(f"names {parsed.database!r}, a SQLite URI file name, without uri=true: SQLite would "
                                  f"create a file called {parsed.database!r}; add ?uri=true")
    _check_driver_options(options)
    if uri and filename.lower().startswith("file:"):
        return _sqlite_uri(url, filename)
    if uri and "?" in filename:
        raise StorageUrlError(f"has uri=true but names no file: URI ({parsed.database!r}): SQLite would create a file "
                              f"called {filename!r}; write sqlite:///file:{parsed.database}?...&uri=true")
    if filename in (":memory:", ""):     # '': SQLite's private temporary database, gone at close
        return StorageTarget(url, "sqlite", in_memory=True)
    return StorageTarget(url, "sqlite", file=Path(os.path.abspath(filename)))


def _check_driver_options(options: dict) -> None:
    """The values of the driver's own options, checked by the driver on a database in memory (nothing
    is opened or created for it), and a lock timeout that is a number of seconds."""
    import sqlite3

    timeout = options.get("timeout")
    if timeout is not None and not (math.isfinite(timeout) and timeout >= 0):
        raise StorageUrlError(f"has timeout={timeout:g}: a lock timeout is a finite number of seconds >= 0")
    try:
        sqlite3.connect(":memory:", **{k: v for k, v in options.items() if k != "uri"}).close()
    except (ValueError, TypeError, OverflowError, sqlite3.Error) as e:
        raise StorageUrlError(f"has an option SQLite's driver refuses ({_first_line(e)})") from None


def _sqlite_uri(url: str, filename: str) -> StorageTarget:
    """A SQLite URI file name, read as SQLite reads it: file:[//[localhost]]PATH[?k=v&...][#...],
    PATH and values percent-decoded."""
    rest = filename[len("file:"):].split("#", 1)[0]
    path, _, query = rest.partition("?")
    if path.startswith("//"):
        authority, slash, path = path[2:].partition("/")
        if authority not in ("", "localhost"):
            raise StorageUrlError(f"names the SQLite URI {filename!r} on host {authority!r}: SQLite opens local "
                                  "files only (file:///PATH or file:NAME)")
        path = slash + path
    params: dict[str, str] = {}
    for pair in filter(None, query.split("&")):
        key, _, value = pair.partition("=")
        key, value = unquote(key), unquote(value)
        if key in params:
            raise StorageUrlError(f"gives its option {key} more than once: give each once")
        params[key] = value
    path = unquote(path)
    mode = params.get("mode")
    if mode is not None and mode not in ("ro", "rw", "rwc", "memory"):
        raise StorageUrlError(f"has mode={mode}: SQLite's modes are ro, rw, rwc and memory")
    if mode == "memory" or path == ":memory:" or not path:
        return StorageTarget(url, "sqlite", in_memory=True)
    immutable = "immutable" in params and sqlite_immutable(params["immutable"])
    read_only = "mode=ro" if mode in _READ_ONLY_MODES else "immutable=" + params["immutable"] if immutable else None
    return StorageTarget(url, "sqlite", file=Path(os.path.abspath(path)), read_only=read_only,
                         creates=mode in (None, "rwc"))


def sqlite_immutable(value: str) -> bool:
    """Whether SQLite reads a URI file name's `immutable=value` as true (the database then read-only),
    asked of SQLite itself on a database of its own in a temporary folder: its boolean rule is its own
    (1, yes, true, on in any case, and also any number it reads as a nonzero byte, `2` among them)."""
    import sqlite3
    import tempfile
    from urllib.parse import quote

    with tempfile.TemporaryDirectory(prefix="autotune-sqlite-") as d:
        probe = os.path.join(d, "probe.db")
        sqlite3.connect(probe).close()
        c = sqlite3.connect(f"file:{quote(probe)}?immutable={quote(value, safe='')}", uri=True)
        try:
            c.execute("CREATE TABLE t (x)")
            return False
        except sqlite3.OperationalError as e:
            return "readonly" in str(e)
        finally:
            c.close()


def _secrets(url: str) -> list[str]:
    """The password parts of a URL: everything between the user's ':' and the last '@' (a password
    may hold '@', ':' or '/'), and `password=` query values; longest first, for masking."""
    import re
    found = re.findall(r"password=([^&#]+)", url, re.I)
    head, sep, _ = url.partition("://")
    rest = url[len(head) + len(sep):] if sep else ""
    creds = rest.rpartition("@")[0]
    if ":" in creds:
        password = creds.split(":", 1)[1]
        # a driver's error may quote a piece of it (the host it misread from 'a@b:c@host')
        found += [password, *(p for p in re.split(r"[:@/]", password) if len(p) >= 2)]
    return sorted(set(found), key=len, reverse=True)


def safe_url(url: str) -> str:
    return scrub(url, url)


def scrub(text: str, url: str) -> str:
    """`text` (a URL, or a driver's message about one) with the URL's password parts masked."""
    for secret in _secrets(url):
        text = text.replace(secret, "***")
    return text


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__


# SQLite's journal for the storages the tool opens: a write-ahead log (the default), or SQLite's own rollback
# journal ("delete": a file system without the shared memory the log needs, NFS say). autotune.store.storage.
JOURNAL_ENV = "AUTOTUNE_SQLITE_JOURNAL"
JOURNALS = ("wal", "delete")


def sqlite_journal() -> str:
    """The journal AUTOTUNE_SQLITE_JOURNAL asks for ("wal" where unset); ValueError, in one line, for another value."""
    value = os.environ.get(JOURNAL_ENV, "wal").strip().lower() or "wal"
    if value not in JOURNALS:
        raise ValueError(f"{JOURNAL_ENV}={os.environ[JOURNAL_ENV]!r}: say {' or '.join(JOURNALS)} (wal where unset)")
    return value
