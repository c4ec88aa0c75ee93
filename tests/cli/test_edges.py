"""The edges no schema reaches (issue 44, part A), on the commands that write: an output that cannot be
written is refused before anything is measured, a folder's and a storage's locks live beside them (not in
$TMPDIR) and go when done, a command that changes nothing rewrites nothing, a storage that is only read
may be read-only. Each case: one line, the exit code, every file that existed byte-identical.

Write protection is what stops this process: an immutable attribute (chattr +i) where the tests run as
root (root writes through permissions), read-only permissions otherwise."""
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.cli import main
from tests.conftest import GRID, ROOT

RUN = ["run", "--model", "qwen3.5-397b-a17b", "--tp", "8", "--dtype", "bf16", "--kernels", "triton_moe", "--quiet",
       "--replay", str(GRID), "--batch-sizes", "8", "--trials", "2"]
COMMITTED = ROOT / "tuned_configs/NVIDIA_H200"


def _snapshot(root: Path) -> dict:
    return {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()}


def _one_line(capsys, rc, code, says) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == code and len(err) == 1 and says in err[0], (rc, err)
    assert err[0].startswith("autotune: error: " if code == 2 else "autotune: ") and "Traceback" not in err[0]
    return err[0]


def _run(t: Path, *extra, out="out", storage="a.db") -> list:
    return [*RUN, "--out", str(t / out), "--storage", f"sqlite:///{t / storage}", *extra]


@contextlib.contextmanager
def write_protected(*paths: Path):
    """`paths` unchangeable for this process while the block runs."""
    root = os.geteuid() == 0
    done = []
    try:
        for path in paths:
            if root:
                r = subprocess.run(["chattr", "+i", str(path)], capture_output=True, text=True)
                if r.returncode:
                    pytest.skip(f"no immutable attribute on this file system: {r.stderr.strip()}")
            else:
                path.chmod(path.stat().st_mode & ~0o222)
            done.append(path)
        yield
    finally:
        for path in done:
            if root:
                subprocess.run(["chattr", "-i", str(path)], capture_output=True)
            else:
                path.chmod(path.stat().st_mode | 0o200)


# --- every refusal before measuring --------------------------------------------------------------------

def test_a_write_protected_recording_is_refused_before_measuring(tmp_path, capsys):
    """It was measured into and refused when written: exit 4 after measuring."""
    record = tmp_path / "r.jsonl.gz"
    shutil.copy(GRID, record)
    before = _snapshot(tmp_path)
    with write_protected(record):
        _one_line(capsys, main(_run(tmp_path, "--record", str(record))), 2, f"--record {record} is ")
    assert _snapshot(tmp_path) == before and not (tmp_path / "out").exists() and not (tmp_path / "a.db").exists()


@pytest.mark.parametrize("protect", ["the-folder", "a-folder-inside", "a-file-inside"])
def test_a_tuned_folder_that_cannot_be_changed_is_refused_before_measuring(tmp_path, capsys, protect):
    """An immutable tuned folder was measured into, then `PermissionError: cannot swap` (a traceback)."""
    folder = tmp_path / "out" / "NVIDIA_H200"
    shutil.copytree(COMMITTED, folder)
    target = {"the-folder": folder, "a-folder-inside": folder / "configs/triton_3_6_0",
              "a-file-inside": folder / "provenance.json"}[protect]
    before = _snapshot(tmp_path)
    with write_protected(target):
        line = _one_line(capsys, main(_run(tmp_path)), 2, f"output folder {folder} cannot be changed: {target} is ")
    assert "nothing measured" in line
    assert _snapshot(tmp_path) == before and not (tmp_path / "a.db").exists()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["NVIDIA_H200"]


def test_out_naming_a_tuned_folder_is_refused_not_nested(tmp_path, capsys):
    """`run --out out/NVIDIA_H200` wrote out/NVIDIA_H200/NVIDIA_H200/ (exit 0), and SGLang pointed at
    out/NVIDIA_H200 kept the old files; merge-choices the same."""
    folder = tmp_path / "out" / "NVIDIA_H200"
    shutil.copytree(COMMITTED, folder)
    before = _snapshot(tmp_path)
    says = f"--out {folder} is itself a tuned folder (it holds provenance.json)"
    _one_line(capsys, main(_run(tmp_path, out="out/NVIDIA_H200")), 2, says)
    _one_line(capsys, main(["merge-choices", str(folder), "--out", str(folder)]), 2, says)
    assert _snapshot(tmp_path) == before and not (folder / "NVIDIA_H200").exists()


# --- locks beside what they hold ------------------------------------------------------------------------------

HOLD = """import sys, time
sys.path.insert(0, {root!r})
from autotune.{module} import {name}
with {call}:
    print("held", flush=True)
    sys.stdin.read()
"""


@contextlib.contextmanager
def held_elsewhere(tmp_path: Path, module: str, name: str, call: str):
    """The lock held by another process whose TMPDIR is not ours, until the block ends."""
    other_tmp = tmp_path / "other-tmp"
    other_tmp.mkdir(exist_ok=True)
    env = {**os.environ, "TMPDIR": str(other_tmp)}
    code = HOLD.format(root=str(ROOT), module=module, name=name, call=call)
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        yield
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)


def test_two_commands_with_different_tmpdirs_meet_on_the_folders_lock(tmp_path, capsys):
    """Two runs into one --out with different TMPDIRs both measured; the loser exited 4 and left
    NVIDIA_H200.autotune-change-PID beside the folder."""
    folder = tmp_path / "out" / "NVIDIA_H200"
    with held_elsewhere(tmp_path, "folder.tuned", "TunedFolder", f"TunedFolder({str(folder)!r}).held()"):
        before = _snapshot(tmp_path)
        _one_line(capsys, main(_run(tmp_path)), 2, f"is writing into {folder}")
        assert _snapshot(tmp_path) == before and not (tmp_path / "a.db").exists()   # the storage untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other-tmp"]        # the lock file went with its change


def test_two_runs_with_different_tmpdirs_meet_on_the_storages_lock(tmp_path, capsys):
    db = tmp_path / "a.db"
    url = f"sqlite:///{db}"
    with held_elsewhere(tmp_path, "store.run_lock", "run_lock", f"run_lock(None, {url!r}, 'NVIDIA_H200~replay')"):
        _one_line(capsys, main(_run(tmp_path)), 2, f"is tuning run 'NVIDIA_H200~replay' in {url}")
        assert not (tmp_path / "out").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.db", "other-tmp"]


def test_a_finished_run_leaves_no_lock_anywhere(tmp_path, capsys, monkeypatch):
    import tempfile

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    assert main(_run(tmp_path)) == 0, capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.db", "out", "tmp"]
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["NVIDIA_H200"]
    assert not [p for p in scratch.rglob("*") if "lock" in p.name]


# --- a command that changes nothing rewrites nothing ------------------------------------------------------------

def test_merge_choices_that_changes_nothing_rewrites_nothing_and_the_folder_still_publishes(tmp_path, capsys):
    """merge-choices wrote new dates into server_args.yaml, backend_choice.json and provenance.json each
    time, and the publish after it was refused ("validation.json judged other bytes")."""
    from tests.fakes.tuned_folders import serving_repo

    folder = tmp_path / "tc" / "NVIDIA_H200"
    shutil.copytree(COMMITTED, folder)
    before = _snapshot(tmp_path)
    for out in (tmp_path / "tc", Path(os.path.relpath(tmp_path / "tc"))):      # however --out is spelled
        assert main(["merge-choices", str(folder), "--out", str(out)]) == 0, capsys.readouterr().err
        assert capsys.readouterr().out.startswith("nothing changed: ")
        assert _snapshot(tmp_path) == before
    assert main(["publish", "--to", str(serving_repo(tmp_path)), "--from", str(folder)]) == 0, capsys.readouterr().err


# --- a storage only read may be read-only; a full one is called full --------------------------------------------

def test_a_storage_on_a_full_disk_is_called_full(tmp_path, capsys, monkeypatch):
    """It was "a read-only file or database user"."""
    import sqlite3

    import optuna

    def full(*args, **kwargs):
        try:
            raise sqlite3.OperationalError("database or disk is full")
        except sqlite3.OperationalError as e:
            raise optuna.exceptions.StorageInternalError("An exception is raised during the commit.") from e
    monkeypatch.setattr(optuna.study.Study, "set_user_attr", full)
    line = _one_line(capsys, main(_run(tmp_path)), 2, "cannot be written (database or disk is full): the disk "
                                                      "that holds it is full")
    assert "read-only" not in line


def test_export_takes_the_run_name_its_refusal_named(tmp_path, capsys):
    """export --study NVIDIA_H200~replay (the name the refusal of a misspelt --study lists) looked for
    NVIDIA_H200~replay~replay and said the storage holds only NVIDIA_H200~replay."""
    from tests.fakes.command_lines import EXPORT, worked_storage

    db = worked_storage(tmp_path)
    capsys.readouterr()
    _one_line(capsys, main([*EXPORT, "--storage", f"sqlite:///{db}", "--study", "typo", "--out", str(tmp_path / "o")]),
              2, "holds no run 'typo~replay' (it holds NVIDIA_H200~replay)")
    assert main([*EXPORT, "--storage", f"sqlite:///{db}", "--study", "NVIDIA_H200~replay", "--trials", "3",
                 "--out", str(tmp_path / "o")]) == 0, capsys.readouterr().err


# --- left from the last round ------------------------------------------------------------------------------------

def test_check_calls_a_config_file_provenance_does_not_list_drift(tmp_path, capsys):
    """A file dropped into configs/triton_3_6_0/ (SGLang would load it) left the committed folder, whose
    provenance records no folder hashes, "fresh"."""
    folder = tmp_path / "NVIDIA_H200"
    shutil.copytree(COMMITTED, folder)
    triton = folder / "configs/triton_3_6_0"
    dropped = triton / "E=512,N=256,device_name=NVIDIA_H200.json"
    shutil.copy(triton / "E=512,N=128,device_name=NVIDIA_H200.json", dropped)
    assert main(["check", str(folder), "--no-retime"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert f"drift: configs/triton_3_6_0/{dropped.name}: not listed in provenance.json: SGLang would load it " \
           "unchecked (remove it, or re-export the folder)" in out
    assert out[-1].startswith("drifted")
    dropped.unlink()
    assert main(["check", str(folder), "--no-retime"]) == 0                 # the folder as exported: fresh


@pytest.mark.parametrize("full", ["said-by-the-disk", "found-when-written"])
def test_rank_model_on_a_full_disk_leaves_no_folder(tmp_path, capsys, monkeypatch, full):
    import errno

    out = tmp_path / "rank" / "tp8"
    if full == "said-by-the-disk":
        real = os.statvfs

        def statvfs(path):
            st = real(path)
            return os.statvfs_result((st.f_bsize, st.f_frsize, st.f_blocks, 0, 0, st.f_files, st.f_ffree,
                                      st.f_favail, st.f_flag, st.f_namemax))
        monkeypatch.setattr(os, "statvfs", statvfs)
        says = "is on a full disk"
    else:
        def fsync(fd):
            raise OSError(errno.ENOSPC, "No space left on device")
        monkeypatch.setattr(os, "fsync", fsync)       # the write that fills the disk, found when it is flushed
        says = "No space left on device"
    rc = main(["rank-model", "--model", "qwen3.5-397b-a17b", "--tp", "8", "--out", str(out)])
    monkeypatch.undo()
    _one_line(capsys, rc, 2, says)
    assert list(tmp_path.iterdir()) == []


def test_a_worker_prints_no_optuna_heartbeat_warning(tmp_path, capsys):
    """Every `autotune worker` printed 12 lines of Optuna's "Heartbeat of storage is supposed to be used with
    Study.optimize" UserWarning."""
    import warnings

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")                   # every warning shown, as a terminal would
        assert main(["worker", "--model", "qwen3.5-397b-a17b", "--tp", "8", "--dtype", "bf16", "--replay", str(GRID),
                     "--batch-sizes", "8", "--trials", "2", "--storage", f"sqlite:///{tmp_path / 'w.db'}"]) == 0
    assert not [w for w in seen if "Heartbeat" in str(w.message)], [str(w.message) for w in seen]
    assert "complete" in capsys.readouterr().out
