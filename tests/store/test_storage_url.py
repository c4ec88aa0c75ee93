"""A storage URL names what SQLAlchemy and SQLite open (autotune/store/storage_url.py): the file every
check works on is the one SQLite creates, whatever the query string or URI form, and what SQLite
would not do as written (an option it drops, a read-only database for a run) is one line first."""
import os
from pathlib import Path

import pytest

from autotune.cli import main
from autotune.store.storage_url import StorageUrlError, parse
from tests.conftest import GRID

ACCEPTED = [
    # url, the file SQLite opens (relative to the working folder; None: in memory), read-only
    ("sqlite:///a.db", "a.db", None),
    ("sqlite:///a.db?timeout=30", "a.db", None),
    ("sqlite:///a.db?timeout=0&check_same_thread=false&detect_types=1&cached_statements=8", "a.db", None),
    ("sqlite:///%61b.db", "ab.db", None),                      # SQLAlchemy decodes the name
    ("sqlite:///sub/a.db?timeout=5", "sub/a.db", None),
    ("sqlite:///a.db#x", "a.db#x", None),                       # a '#' is part of a plain file name
    ("sqlite:///a.db?uri=true", "a.db", None),
    ("sqlite:///file:u.db?uri=true", "u.db", None),
    ("sqlite:///file:u.db?uri=true&cache=shared&timeout=3", "u.db", None),
    ("sqlite:///file:u.db?mode=rwc&uri=true", "u.db", None),
    ("sqlite:///file:u%2561.db?uri=true", "ua.db", None),       # SQLite decodes a URI's path again
    ("sqlite:///file:u.db?mode=ro&uri=true", "u.db", "mode=ro"),
    ("sqlite:///file:u.db?immutable=1&uri=true", "u.db", "immutable=1"),
    ("sqlite:///file:u.db?immutable=true&uri=true", "u.db", "immutable=true"),   # SQLite's booleans, all of them
    ("sqlite:///file:u.db?immutable=0&uri=true", "u.db", None),
    ("sqlite://", None, None),
    ("sqlite:///:memory:", None, None),
    ("sqlite:///file::memory:?uri=true", None, None),
    ("sqlite:///file:m.db?mode=memory&uri=true", None, None),
    ("sqlite:///?uri=true", None, None),                       # SQLite's private temporary database
]


@pytest.mark.parametrize("url,file,read_only", ACCEPTED)
def test_the_file_a_url_names_is_the_one_sqlite_opens(tmp_path, monkeypatch, url, file, read_only):
    """Each URL opened for real through SQLAlchemy in an empty folder: the one file that appears is
    the file parse() named (none for a database in memory); a read-only one is said, and SQLite
    indeed refuses to write it."""
    import sqlalchemy

    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    target = parse(url)
    assert target.read_only == read_only
    assert target.in_memory == (file is None)
    assert target.file == (None if file is None else tmp_path / file)
    if read_only:
        sqlalchemy.create_engine(url.replace("mode=ro", "mode=rwc").replace("immutable=1", "x=1")
                                 .replace("&x=1", "")).connect().close()      # make it, then open it read-only
    engine = sqlalchemy.create_engine(url)
    try:
        with engine.begin() as c:
            c.execute(sqlalchemy.text("CREATE TABLE t (x)"))
        assert not read_only, "SQLite wrote a database parse() called read-only"
    except sqlalchemy.exc.OperationalError as e:
        assert read_only and "readonly" in str(e)
    finally:
        engine.dispose()
    made = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert made == ([] if file is None else [file])



@pytest.mark.parametrize("value", ["1", "true", "TRUE", "yes", "On", "2", "0", "false", "no", "off", "x", ""])
def test_immutable_is_read_only_exactly_where_sqlite_reads_it_as_true(tmp_path, value):
    """SQLite's own boolean rule, not a list of ours: `immutable=true` (any case, or yes, on, 2) makes the
    database read-only, `0`, `false`, `off` or a word it does not know leave it writable. Each URL opened
    for real: parse() calls it read-only exactly where SQLite refuses the write."""
    import sqlite3

    import sqlalchemy

    db = tmp_path / "u.db"
    sqlite3.connect(db).close()
    url = f"sqlite:///file:{db}?immutable={value}&uri=true"
    engine = sqlalchemy.create_engine(url)
    try:
        with engine.begin() as c:
            c.execute(sqlalchemy.text("CREATE TABLE t (x)"))
        wrote = True
    except sqlalchemy.exc.OperationalError as e:
        assert "readonly" in str(e)
        wrote = False
    finally:
        engine.dispose()
    assert parse(url).read_only == (None if wrote else f"immutable={value}")


REFUSED = [
    ("sqlite:///a.db?mode=ro", "SQLite reads mode only from a URI file name"),
    ("sqlite:///a.db?immutable=1", "SQLite reads immutable only from a URI file name"),
    ("sqlite:///file:a.db?mdoe=ro&uri=true", "has option(s) mdoe that would be ignored"),
    ("sqlite:///a.db?isolation_level=EXCLUSIVE", "has option(s) isolation_level that would be ignored"),
    ("sqlite:///a.db?timeout=1&timeout=2", "gives its option timeout more than once"),
    ("sqlite:///file:a.db?uri=true&mode=ro&mode=rw", "gives its option mode more than once"),
    ("sqlite:///a.db?timeout=soon", "could not convert string to float"),
    ("sqlite:///a.db?timeout=nan", "a lock timeout is a finite number of seconds"),
    ("sqlite:///a.db?timeout=-1", "a lock timeout is a finite number of seconds"),
    ("sqlite:///file:a.db", "a SQLite URI file name, without uri=true"),
    ("sqlite:///a.db?mode=ro&uri=true", "SQLite would create a file called 'a.db?mode=ro'"),
    ("sqlite:///file:a.db?mode=rox&uri=true", "SQLite's modes are ro, rw, rwc and memory"),
    ("sqlite:///file://host/a.db?uri=true", "SQLite opens local files only"),
    ("sqlite://user@host/a.db", "Invalid SQLite URL"),
    ("a.db", "is not a database URL"),
    ("postgresql://bob:pa@ss@h:x/db", "is not a database URL"),
    ("sqlite://?uri=true", "names no database file"),           # found by the property suite (a traceback)
]


@pytest.mark.parametrize("url,says", REFUSED)
def test_a_url_sqlite_would_not_open_as_written_is_one_line(tmp_path, monkeypatch, url, says):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(StorageUrlError) as e:
        parse(url)
    assert says in str(e.value) and "\n" not in str(e.value)
    assert "pa@ss" not in str(e.value) and not list(tmp_path.iterdir())


RUN = ["run", "--model", "qwen3.5-397b-a17b", "--tp", "8", "--dtype", "bf16", "--kernels", "triton_moe", "--quiet",
       "--replay", str(GRID), "--batch-sizes", "8"]
EXPORT = ["export", *RUN[1:7], *RUN[9:]]


@pytest.mark.slow      # whole commands (run, export, run): the URL's reading is pinned by the parse tests above
def test_a_query_string_keeps_every_check_on_the_real_file(tmp_path, capsys):
    """`?timeout=30` used to hide the file from every check: a run wrote Optuna's tables into the
    user's own database (exit 0) and export said a storage full of studies held none."""
    import sqlite3

    mine = tmp_path / "mine.db"
    with sqlite3.connect(mine) as c:
        c.execute("CREATE TABLE mine (x)")
    before = mine.read_bytes()
    assert main([*RUN, "--out", str(tmp_path / "o1"), "--storage", f"sqlite:///{mine}?timeout=30"]) == 2
    assert "holds tables that are not Optuna's (mine)" in capsys.readouterr().err
    assert mine.read_bytes() == before and not (tmp_path / "o1").exists()

    db = tmp_path / "a.db"
    assert main([*RUN, "--out", str(tmp_path / "o2"), "--storage", f"sqlite:///{db}?timeout=30"]) == 0
    assert db.is_file() and not list(tmp_path.glob("a.db?*"))
    stored = db.read_bytes()
    capsys.readouterr()
    assert main([*EXPORT, "--out", str(tmp_path / "o3"), "--storage", f"sqlite:///{db}?timeout=30"]) == 0, \
        capsys.readouterr().err
    assert list((tmp_path / "o3").glob("*/configs/*/*.json")) and db.read_bytes() == stored
    assert main([*RUN, "--out", str(tmp_path / "o4"), "--storage", f"sqlite:///{tmp_path / 'b.db'}?timeout=30",
                 "--record", str(tmp_path / "b.db")]) == 2
    assert "--record and --storage name the same file" in capsys.readouterr().err


@pytest.mark.slow      # whole commands; read-only is pinned by the parse tests, its refusal by test_reliability
def test_a_read_only_storage_warm_starts_a_run_and_is_exported_but_holds_none(tmp_path, capsys):
    """export only reads its run: a read-only storage was refused ("it cannot hold a run") though valid."""
    db = tmp_path / "a.db"
    assert main([*RUN, "--out", str(tmp_path / "o1"), "--storage", f"sqlite:///{db}"]) == 0
    stored = db.read_bytes()
    read_only = f"sqlite:///file:{db}?mode=ro&uri=true"
    capsys.readouterr()
    for argv in ([*RUN, "--out", str(tmp_path / "o2"), "--storage", read_only],
                 ["worker", *EXPORT[1:], "--storage", read_only]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "it cannot hold a run" in err[0], err
    assert not (tmp_path / "o2").exists()
    assert main([*EXPORT, "--out", str(tmp_path / "e"), "--storage", read_only]) == 0, capsys.readouterr().err
    assert list((tmp_path / "e").glob("*/configs/*/E=512,N=128,device_name=NVIDIA_H200.json"))
    assert main([*RUN, "--out", str(tmp_path / "o3"), "--storage", f"sqlite:///{tmp_path / 'b.db'}",
                 "--warm-start", read_only]) == 0
    assert db.read_bytes() == stored


def test_one_run_lock_per_database_file_however_the_url_names_it(tmp_path, monkeypatch):
    from autotune.store.run_lock import _key

    monkeypatch.chdir(tmp_path)
    spellings = ["sqlite:///a.db", f"sqlite:///{tmp_path}/a.db", "sqlite:///a.db?timeout=30",
                 "sqlite:///file:a.db?uri=true&cache=shared", f"sqlite:///{tmp_path}/sub/../a.db"]
    assert len({_key(url, "run") for url in spellings}) == 1
    assert _key("sqlite:///b.db", "run") != _key("sqlite:///a.db", "run")
    os.makedirs(tmp_path / "sub")
    assert Path(parse(spellings[-1]).file).resolve() == tmp_path / "a.db"


@pytest.mark.parametrize("journal, want", [(None, "wal"), ("delete", "delete")])
def test_a_sqlite_storage_commits_to_a_write_ahead_log_unless_told_not_to(tmp_path, monkeypatch, journal, want):
    """A run's SQLite file keeps a write-ahead log with synchronous=NORMAL (a commit does not wait for the disk:
    Optuna's ~10 commits a measurement held the GPU's feeder back); AUTOTUNE_SQLITE_JOURNAL=delete keeps SQLite's
    own journal, for a file system where the log cannot work (NFS)."""
    from autotune.store.storage import open_storage

    if journal:
        monkeypatch.setenv("AUTOTUNE_SQLITE_JOURNAL", journal)
    else:
        monkeypatch.delenv("AUTOTUNE_SQLITE_JOURNAL", raising=False)
    storage = open_storage(f"sqlite:///{tmp_path / 'a.db'}")
    with storage.engine.connect() as c:
        mode = c.exec_driver_sql("PRAGMA journal_mode").scalar()
        sync = c.exec_driver_sql("PRAGMA synchronous").scalar()
    storage.engine.dispose()
    assert mode == want and sync == (1 if want == "wal" else 2)        # NORMAL = 1, FULL = 2 (SQLite's default)


def test_a_journal_said_wrongly_is_one_line_and_exit_2_before_anything_is_written(tmp_path):
    """AUTOTUNE_SQLITE_JOURNAL other than wal or delete: one line naming the variable and what it takes, exit 2,
    no storage and no folder made (it was taken silently as SQLite's own journal)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "AUTOTUNE_SQLITE_JOURNAL": "walz"}
    p = subprocess.run([sys.executable, "-m", "autotune", "run", "--shapes", "qwen3.5", "--tp", "8", "--replay",
                        str(Path(__file__).parents[1] / "data" / "h200_triton_moe_bf16_grid.jsonl.gz"), "--storage",
                        f"sqlite:///{tmp_path / 'a.db'}", "--out", str(tmp_path / "o")],
                       capture_output=True, text=True, env=env, cwd=tmp_path)
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip().count("\n") == 0 and "AUTOTUNE_SQLITE_JOURNAL='walz'" in p.stderr
    assert sorted(f.name for f in tmp_path.iterdir()) == []
