import os
import sys

# setup.sh installs without compiling bytecode (Python compiles what it imports and keeps it). Where the
# environment forbids keeping it (PYTHONDONTWRITEBYTECODE, set on some machines), every test run would
# compile torch and SGLang again: keep it, in the test processes and (the variable dropped) the
# subprocesses they start.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

# SGLang's Triton kernels run in Triton's CPU interpreter (fp32) in these tests; the variable
# must be set before triton.jit decorates them, i.e. before any sglang kernel import.
os.environ.setdefault("TRITON_INTERPRET", "1")

import shutil  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
GRID = ROOT / "tests/data/h200_triton_moe_bf16_grid.jsonl.gz"


def _scratch_in_memory(config) -> None:
    """The session's temporary files (pytest's tmp_path, the processes tests start: TMPDIR) on a tmpfs
    where the machine has one with room: SQLite commits there cost 0.08 ms, not 3 ms of fsync on this
    machine's disk, and a replay run makes about 1800 of them (docs/TESTING.md). Nothing of the product
    changes; AUTOTUNE_TEST_TMP=disk keeps the system's temp folder."""
    shm = Path("/dev/shm")
    if os.environ.get("AUTOTUNE_TEST_TMP") == "disk" or not (shm.is_dir() and os.access(shm, os.W_OK)):
        return
    st = os.statvfs(shm)
    if st.f_bavail * st.f_frsize < 2 * 2**30:
        return
    folder, before = tempfile.mkdtemp(prefix="autotune-tests-", dir=shm), os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = folder
    tempfile.tempdir = None                  # gettempdir() reads TMPDIR again

    def restore():                           # a later session in this process (mutmut's) starts afresh
        shutil.rmtree(folder, ignore_errors=True)
        if before is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = before
        tempfile.tempdir = None
    config.add_cleanup(restore)


def pytest_configure(config):
    if "PYTEST_XDIST_WORKER" not in os.environ and config.option.basetemp is None:
        _scratch_in_memory(config)
    # SGLang's loader answers are remembered on disk (autotune/adapters/sglang_loader.py): one memo
    # for this test session, shared by its xdist workers and the processes they start (they
    # inherit the variable), never the user's own.
    if "PYTEST_XDIST_WORKER" not in os.environ and "AUTOTUNE_CACHE_DIR" not in os.environ:
        folder = tempfile.mkdtemp(prefix="autotune-test-cache-")
        os.environ["AUTOTUNE_CACHE_DIR"] = folder
        config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))
    # hypothesis keeps its caches (unicode tables) in ./.hypothesis: here, in a folder of the session's
    if "PYTEST_XDIST_WORKER" not in os.environ and "HYPOTHESIS_STORAGE_DIRECTORY" not in os.environ:
        home = tempfile.mkdtemp(prefix="autotune-test-hypothesis-")
        os.environ["HYPOTHESIS_STORAGE_DIRECTORY"] = home
        config.add_cleanup(lambda: shutil.rmtree(home, ignore_errors=True))


# Tests never write into the checkout (a ./autotune.db, a tuned_configs/replay/, a .hypothesis/ left
# behind by a command run with its defaults): the session fails if the tree has a path it did not have.
_NOT_THE_TREE = {".git", ".venv", "__pycache__", ".pytest_cache"}


def _checkout_paths() -> set:
    out = set()
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in _NOT_THE_TREE]
        rel = Path(folder).relative_to(ROOT)
        out.update(str(rel / n) for n in dirs + files)
    return out


def pytest_sessionstart(session):
    if "PYTEST_XDIST_WORKER" not in os.environ:
        session.config._checkout_before = _checkout_paths()


def pytest_sessionfinish(session, exitstatus):
    before = getattr(session.config, "_checkout_before", None)
    if before is None:
        return
    new = sorted(_checkout_paths() - before)
    if new:
        session.config.get_terminal_writer().line(
            f"tests wrote into the checkout {ROOT}: {', '.join(new[:10])}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_collection_modifyitems(config, items):
    # Container tests take minutes and need the built image: only a run that selects them by name
    # (-m container) runs them; the quick and slow tiers skip them at once.
    if "container" in (config.option.markexpr or ""):
        return
    skip = pytest.mark.skip(reason="container tests run only with -m container (.ci/run's container phase)")
    for item in items:
        if item.get_closest_marker("container"):
            item.add_marker(skip)


def finished_trials(db_path) -> int:
    """COMPLETE trials in a SQLite study file, by one read-only query: cheap enough to poll while
    the run writes (loading every study twice a second kept its writer waiting on the database
    lock; on a slow CI machine the run made under 40 measurements in 400 s)."""
    import contextlib
    import sqlite3

    try:
        with contextlib.closing(sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=0.2)) as c:
            return c.execute("SELECT COUNT(*) FROM trials WHERE state = 'COMPLETE'").fetchone()[0]
    except sqlite3.Error:          # not created yet, or locked this instant
        return 0


def wait_for_trials(proc, db_path, n: int, what: str, timeout: float = 400) -> None:
    """Until the run has stored `n` COMPLETE trials while still running (the storage is the only
    signal a run gives mid-search), at most `timeout` s: a loaded 2-core machine starts slowly."""
    import subprocess
    import time

    deadline = time.monotonic() + timeout
    while finished_trials(db_path) < n:
        assert time.monotonic() < deadline, f"{what}: fewer than {n} trials in {timeout:.0f} s"
        try:                        # the run's exit ends the wait at once; else look at the storage again
            proc.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            continue
        raise AssertionError(f"{what}: the run ended before {n} trials were stored")


@pytest.fixture(scope="session")
def grid_cache():
    from autotune.measure.records import read_cache
    return read_cache(GRID)


@pytest.fixture(scope="session")
def h200(grid_cache):
    from autotune.gpus.device import DeviceInfo
    return DeviceInfo.from_dict(grid_cache.device)


@pytest.fixture
def qwen397_bf16():
    from autotune.problems.models import Problem
    return Problem(E=512, N=128, K=4096, top_k=10, dtype="bf16", batch_sizes=(1, 8, 32, 64, 256, 1024, 4096))
