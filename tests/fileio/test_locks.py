"""The locks a command takes (one run per storage and run name, one writer per tuned folder) leave no file
behind once let go (issue 44: every run left an autotune-run-*.lock and an autotune-folder-*.lock in the
temp folder), and removing the file never lets two processes hold one lock."""
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from autotune.fileio import locks
from autotune.folder.change import FolderChange
from autotune.store.run_lock import RunLocked, run_lock
from tests.conftest import ROOT


def test_a_lock_let_go_leaves_no_file_and_a_held_one_refuses_with_its_holder(tmp_path):
    path = tmp_path / "x.lock"
    fd = locks.take(path, "pid 1 of the first")
    with pytest.raises(locks.Busy, match="pid 1 of the first"):
        locks.take(path, "pid 2")
    locks.release(path, fd)
    assert not path.exists()
    locks.release(path, locks.take(path, "pid 3"))        # taken again once let go
    assert not path.exists()


def test_a_lock_file_removed_under_a_late_opener_is_never_held_twice(tmp_path, monkeypatch):
    """A process that opened the lock file just before its holder let go of it and removed it locks a
    file no path names: it must take the lock again on the file the path names now, where a third
    process would look."""
    path = tmp_path / "x.lock"
    first = locks.take(path, "pid 1")
    late = os.open(path, os.O_RDWR)          # opened while the first holds it
    locks.release(path, first)
    third = locks.take(path, "pid 3")       # a new file at the path, held
    real_open, opened = os.open, []

    def open_late_first(p, flags, mode=0o777):
        if not opened:
            opened.append(p)
            return late                      # the late opener's descriptor, of the removed file
        return real_open(p, flags, mode)
    monkeypatch.setattr(locks.os, "open", open_late_first)
    with pytest.raises(locks.Busy, match="pid 3"):
        locks.take(path, "pid 2")
    assert opened                           # it went through the removed file first
    locks.release(path, third)


def test_a_run_lock_and_a_folder_lock_lie_beside_what_they_guard_and_leave_no_file(tmp_path, monkeypatch):
    """Beside the storage and the folder, never in the temp folder (two TMPDIRs took two locks for one folder),
    and gone once let go."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    url = f"sqlite:///{tmp_path / 's.db'}"
    with run_lock(None, url, "r"):
        assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".lock")][0].startswith(".s.db.run-")
        with pytest.raises(RunLocked, match=f"pid {os.getpid()}"):
            with run_lock(None, url, "r"):
                pass
    change = FolderChange(tmp_path / "out" / "NVIDIA_H200").lock()
    assert change.lock_path.exists() and change.lock_path.parent == tmp_path / "out"
    change.release()
    assert list((tmp_path / "tmp").iterdir()) == [] and not list(tmp_path.rglob("*.lock"))


@pytest.mark.slow
def test_a_replay_run_leaves_no_lock_file_in_the_temp_folder(tmp_path):
    """The whole command: `autotune run` with its own temp folder, which holds nothing after it."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    args = ["run", "--model", "qwen3.5-397b-a17b", "--tp", "8", "--dtype", "bf16", "--kernels", "triton_moe",
            "--replay", str(ROOT / "tests/data/h200_triton_moe_bf16_grid.jsonl.gz"), "--batch-sizes", "1",
            "--trials", "3", "--quiet", "--storage", f"sqlite:///{tmp_path / 's.db'}", "--out", str(tmp_path / "o")]
    r = subprocess.run([sys.executable, "-m", "autotune", *args], cwd=tmp_path, capture_output=True, text=True,
                       env={**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": str(ROOT)}, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert [p.name for p in tmp.iterdir() if p.name.startswith("autotune-")] == []
    assert list(Path(tmp_path / "o").rglob("E=*.json"))
