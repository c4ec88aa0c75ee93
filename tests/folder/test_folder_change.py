"""A tuned folder changes as one (autotune/folder/change.py, held through its handle autotune/folder/tuned.py): a
write that fails anywhere in a command's
change set leaves the folder byte-identical; one writer at a time; a folder changed by another hand
while a run measured is not swapped over."""
import errno
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.fileio import writing
from autotune.cli import main
from autotune.folder.change import FolderChange
from autotune.folder.tuned import TunedFolder
from autotune.store.run_lock import RunLocked
from tests.conftest import GRID, ROOT


def _bytes(root: Path) -> dict:
    """Every file and folder under root, with its bytes' hash (a folder: None)."""
    return {str(p.relative_to(root)): (hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None)
            for p in sorted(root.rglob("*"))}


def _leftovers(out: Path) -> list:
    return [p.name for p in out.iterdir() if ".staged-" in p.name or ".old-" in p.name]


def test_a_committed_change_replaces_the_folder_whole_and_leaves_no_copy(tmp_path):
    folder = tmp_path / "NVIDIA_H200"
    (folder / "configs").mkdir(parents=True)
    (folder / "configs" / "a.json").write_text("old a")
    (folder / "b.json").write_text("old b")
    with TunedFolder(folder).held() as change:
        s = change.begin()
        assert change.path == s != folder
        (s / "configs" / "a.json").write_text("new a")
        (s / "c.json").write_text("new c")
        (s / "b.json").unlink()
        assert (folder / "configs" / "a.json").read_text() == "old a"     # nothing seen before the swap
    assert change.outcome is None
    assert _bytes(folder).keys() == {"configs", "configs/a.json", "c.json"}
    assert (folder / "configs" / "a.json").read_text() == "new a"
    assert _leftovers(tmp_path) == [] and change.path == folder


def test_a_failed_write_throws_the_whole_change_away(tmp_path):
    folder = tmp_path / "NVIDIA_H200"
    folder.mkdir()
    (folder / "a.json").write_text("old a")
    before = _bytes(folder)
    with TunedFolder(folder).held() as change:
        s = change.begin()
        (s / "a.json").write_text("new a")
        change.fail("writing b.json failed: No space left on device")
    assert "nothing in" in change.outcome and "No space left" in change.outcome
    assert _bytes(folder) == before and _leftovers(tmp_path) == []


def test_an_error_inside_the_change_throws_it_away(tmp_path):
    folder = tmp_path / "new_folder"
    with pytest.raises(KeyboardInterrupt):
        with TunedFolder(folder).held() as change:
            (change.begin() / "a.json").write_text("x")
            raise KeyboardInterrupt
    assert not folder.exists() and _leftovers(tmp_path) == []


def test_a_second_writer_is_refused_while_the_first_holds_the_folder(tmp_path):
    folder = tmp_path / "NVIDIA_H200"
    with TunedFolder(folder).held():
        code = (f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
                "from autotune.folder.change import FolderChange\n"
                "from autotune.store.run_lock import RunLocked\n"
                f"try: FolderChange({str(folder)!r}).lock()\n"
                "except RunLocked as e: print(e); sys.exit(3)\n")
        other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert other.returncode == 3 and "is writing into" in other.stdout, other
        with pytest.raises(RunLocked):
            FolderChange(folder).lock()
    FolderChange(folder).lock().release()          # free again once the first is done


def test_a_folder_changed_by_another_hand_meanwhile_is_not_swapped_over(tmp_path):
    folder = tmp_path / "NVIDIA_H200"
    folder.mkdir()
    (folder / "a.json").write_text("old a")
    with TunedFolder(folder).held() as change:
        (change.begin() / "a.json").write_text("ours")
        (folder / "a.json").write_text("a hand edit")
    assert (folder / "a.json").read_text() == "a hand edit"
    assert "changed by another hand" in change.outcome
    aside = next(tmp_path.glob("NVIDIA_H200.autotune-change-*"))
    assert (aside / "a.json").read_text() == "ours"      # the run's change is kept, not dropped


def _run(t: Path, batch_sizes: str) -> list:
    t.mkdir(parents=True, exist_ok=True)
    return ["run", "--model", "qwen3.5-397b-a17b", "--tp", "8", "--dtype", "bf16", "--kernels", "triton_moe",
            "--quiet", "--trials", "2", "--batch-sizes", batch_sizes, "--replay", str(GRID), "--out", str(t / "out"),
            "--storage", f"sqlite:///{t / 'a.db'}", "--device-name", "NVIDIA H200 NVL"]


BACKENDS = ROOT / "benchmarks/data/h200_backends_2026-12-01.jsonl.gz"


def _export(t: Path, batch_sizes: str) -> list:
    return ["export", "--model", "qwen3.5-397b-a17b", "--tp", "8", "--dtype", "bf16", "--trials", "2",
            "--batch-sizes", batch_sizes, "--replay", str(GRID), "--out", str(t / "exported"),
            "--storage", f"sqlite:///{t / 'a.db'}"]


def _backends(t: Path) -> list:
    return ["run", "--model", "qwen3.5-397b-a17b", "--tp", "8", "--kernels", "moe_bf16", "--quiet", "--replay",
            str(BACKENDS), "--out", str(t / "out"), "--storage", f"sqlite:///{t / 'b.db'}"]


def _setup_run(root: Path):
    assert main(_run(root, "8")) == 0
    return _run(root, "8,32"), root / "out"            # adds a batch size: configs, SKU copies, provenance


def _setup_export(root: Path):
    assert main(_run(root, "8,32")) == 0
    assert main(_export(root, "8")) == 0
    return _export(root, "8,32"), root / "exported"


def _setup_backends(root: Path):
    assert main(_run(root, "8")) == 0                  # a folder with configs, then the backend choice into it
    return _backends(root), root / "out"


def _setup_merge(root: Path):
    assert main(_backends(root)) == 0
    serving = root / "serving" / "NVIDIA_H200"
    serving.mkdir(parents=True)
    (serving / "server_args.yaml").write_text("# my server\ntp-size: 8\n")
    return ["merge-choices", str(root / "out" / "NVIDIA_H200"), "--out", str(root / "serving")], root / "serving"


@pytest.mark.parametrize("setup", [_setup_run, _setup_export, _setup_backends, _setup_merge],
                         ids=["run", "export", "run-backends", "merge-choices"])
def test_a_write_failing_anywhere_in_a_change_leaves_the_folder_byte_identical(tmp_path, monkeypatch, capsys, setup):
    """Each writing command's change set: its first, a middle and its last write each fail in turn (a
    full disk), and the folder is byte-identical afterwards; then the same command puts the change in."""
    real = writing.atomic_file
    writes = []

    def counting(path):
        if tmp_path in Path(path).parents:               # the run's own, not a cache in the home folder
            writes.append(path)
        return real(path)
    probe_args, _ = setup(tmp_path / "probe")           # the same change on a twin: how many writes it makes
    monkeypatch.setattr(writing, "atomic_file", counting)
    assert main(probe_args) == 0
    n = len(writes)
    assert n >= 2, writes
    args, out = setup(tmp_path / "real")
    before = _bytes(out)
    for k in sorted({0, n // 2, n - 1}):
        writes.clear()

        def failing(path, k=k):
            if tmp_path not in Path(path).parents:
                return real(path)
            writes.append(path)
            if len(writes) == k + 1:
                raise writing.WriteError(f"cannot write {path}: {errno.errorcode[errno.ENOSPC]}")
            return real(path)
        monkeypatch.setattr(writing, "atomic_file", failing)
        capsys.readouterr()
        rc = main(args)
        err = capsys.readouterr().err
        assert rc != 0 and len(writes) > k, (k, rc, err)
        assert _bytes(out) == before, f"write {k + 1} of {n} failing changed the folder"
        assert _leftovers(out) == []
    monkeypatch.setattr(writing, "atomic_file", real)
    assert main(args) == 0                              # the disk has room again: the change goes in
    assert _bytes(out) != before


def _ours(out: Path) -> Path:
    return next(p for p in out.rglob("E=512,N=128,device_name=NVIDIA_H200.json"))


def test_a_hand_edited_config_is_never_merged_or_certified_again(tmp_path, capsys):
    import json

    assert main(_run(tmp_path, "8")) == 0
    out = tmp_path / "out"
    path = _ours(out)
    doc = json.loads(path.read_text())
    doc["8"]["num_warps"] = 2 if doc["8"]["num_warps"] != 2 else 4
    path.write_text(json.dumps(doc))                       # the hand edit
    before = _bytes(out)
    capsys.readouterr()
    assert main(_run(tmp_path, "8,16")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "changed since autotune wrote it" in err[0] and "--force" in err[0], err
    assert _bytes(out) == before                           # refused before measuring, nothing written
    assert main([*_run(tmp_path, "8,16"), "--force"]) == 0  # replaced, never merged: the measured entry is back
    assert json.loads(path.read_text())["8"] != doc["8"]
    assert main(["check", str(out / "NVIDIA_H200"), "--no-retime"]) in (0, 1)
    assert "changed since export" not in capsys.readouterr().out


def test_a_folder_of_another_gpu_is_refused_before_measuring_not_emptied(tmp_path, capsys):
    import json

    assert main(_run(tmp_path, "1,8")) == 0
    out = tmp_path / "out"
    prov_path = out / "NVIDIA_H200" / "provenance.json"
    prov = json.loads(prov_path.read_text())
    prov["device"]["name"] = "NVIDIA H100 80GB HBM3"
    prov_path.write_text(json.dumps(prov))
    before = _bytes(out)
    capsys.readouterr()
    assert main(_run(tmp_path, "8")) == 2
    err = capsys.readouterr().err
    assert "tuned on NVIDIA H100 80GB HBM3" in err and "its entries would be dropped" in err
    assert _bytes(out) == before


def test_check_reads_every_file_of_the_folder_listed_or_not(tmp_path, capsys):
    import json

    assert main(_run(tmp_path, "8")) == 0
    folder = tmp_path / "out" / "NVIDIA_H200"
    prov = json.loads((folder / "provenance.json").read_text())
    on_disk = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}
    assert set(prov["folder_sha256"]) == on_disk - {"provenance.json"}     # every file, by its hash
    capsys.readouterr()
    assert main(["check", str(folder), "--no-retime"]) == 0
    config_dir = _ours(tmp_path / "out").parent
    stray = config_dir / "E=64,N=64,device_name=NVIDIA_H200.json"          # SGLang would serve it
    stray.write_text(json.dumps({"1": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64,
                                       "GROUP_SIZE_M": 1, "num_warps": 4, "num_stages": 2}}))
    capsys.readouterr()
    assert main(["check", str(folder), "--no-retime"]) == 1
    out = capsys.readouterr().out
    assert f"drift: {stray.relative_to(folder).as_posix()}: not written by autotune" in out, out


def test_a_file_in_the_way_of_a_config_folder_is_refused_before_measuring(tmp_path, capsys):
    """SGLang's per-Triton folders, ours or the shipped overlay's: a file there was found only when the
    overlay wrote, after the search."""
    blocker = tmp_path / "out" / "NVIDIA_H200" / "configs" / "triton_3_8_0"
    blocker.parent.mkdir(parents=True)
    blocker.write_text("not a folder")
    capsys.readouterr()
    assert main(_run(tmp_path, "8")) == 2
    err = capsys.readouterr().err
    assert "triton_3_8_0 is a file where a folder of SGLang's config files goes" in err
    assert not (tmp_path / "a.db").exists()            # nothing measured, no storage made


# -- the change's parts, one by one ------------------------------------------------------------------

def _folder(root: Path, files: dict) -> Path:
    folder = root / "NVIDIA_H200"
    for rel, text in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(text)
    return folder


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_the_refusal_names_the_holder_and_the_folder_as_given(tmp_path):
    folder = tmp_path / "NVIDIA_H200"
    lock_path = FolderChange(folder).lock_path
    lock_path.write_text("pid 123456789012 of a writer long gone")     # a longer text than ours
    with TunedFolder(folder).held():
        with pytest.raises(RunLocked) as e:
            FolderChange(tmp_path / "x" / ".." / "NVIDIA_H200").lock()   # the same folder, spelled otherwise
    assert str(e.value) == (f"another autotune command (pid {os.getpid()}) is writing into "
                            f"{tmp_path}/x/../NVIDIA_H200; wait for it to finish, or write into another --out")
    assert sorted(p.name for p in tmp_path.iterdir()) == []            # nothing left in the user's folder


def test_a_holder_that_has_not_yet_written_its_pid_is_another_process(tmp_path):
    import fcntl

    folder = tmp_path / "NVIDIA_H200"
    lock_path = FolderChange(folder).lock_path
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT)
    try:
        os.ftruncate(fd, 0)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)                   # between its flock and its pwrite
        with pytest.raises(RunLocked, match=r"^another autotune command \(another process\) is writing into"):
            FolderChange(folder).lock()
    finally:
        os.close(fd)


def test_a_killed_writers_staged_copy_is_removed_when_the_folder_is_next_locked(tmp_path):
    folder = _folder(tmp_path, {"a.json": "old"})
    for stale in (".NVIDIA_H200.staged-4242", ".NVIDIA_H200.staged-7"):
        (tmp_path / stale / "configs").mkdir(parents=True)
        (tmp_path / stale / "configs" / "half.json").write_text("half a change")
    (tmp_path / ".NVIDIA_H100.staged-4242").mkdir()                   # another folder's: not ours to remove
    FolderChange(folder).lock().release()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".NVIDIA_H100.staged-4242", "NVIDIA_H200"]


def test_a_stale_copy_that_cannot_be_removed_does_not_stop_the_next_writer(tmp_path):
    folder = _folder(tmp_path, {"a.json": "old"})
    (tmp_path / ".NVIDIA_H200.staged-4242").write_text("a file, not a staged folder")
    with TunedFolder(folder).held() as change:
        (change.begin() / "a.json").write_text("new")
    assert change.outcome is None and (folder / "a.json").read_text() == "new"


def test_paths_and_messages_inside_a_change_name_the_folder_as_the_user_gave_it(tmp_path, monkeypatch):
    from types import SimpleNamespace

    monkeypatch.chdir(tmp_path)
    (tmp_path / "x").mkdir()
    folder = TunedFolder.under("out", SimpleNamespace(file_name="NVIDIA_H200"))
    assert folder.path == folder.given == Path("out/NVIDIA_H200")
    with folder.held() as change:
        assert change.path == Path("out/NVIDIA_H200")                   # not staged before begin()
        s = change.begin()
        assert change.begin() == s                                      # staged once
        assert s == tmp_path / "out" / f".NVIDIA_H200.staged-{os.getpid()}"
        assert change.path == s
        assert change.real(s / "configs" / "a.json") == "out/NVIDIA_H200/configs/a.json"
        assert change.in_words(f"cannot write {s}/a.json nor {s}/b.json") == (
            "cannot write out/NVIDIA_H200/a.json nor out/NVIDIA_H200/b.json")
    assert folder.path == Path("out/NVIDIA_H200")
    assert folder.real(tmp_path / "out") == str(tmp_path / "out")       # no change open: as it is


def test_a_failed_write_step_throws_the_change_away_and_the_first_failure_is_said(tmp_path, capsys):
    from autotune.run.sinks import Summary, after_search

    def full(path):
        raise OSError(28, "No space left on device", str(path))
    a, b = _folder(tmp_path / "a", {"x.json": "old"}), _folder(tmp_path / "b", {"x.json": "old"})
    summary = Summary()
    with TunedFolder(a).held() as ca, TunedFolder(b).held() as cb:
        for c in (ca, cb):
            (c.begin() / "x.json").write_text("new")
        after_search(summary, "writing y.json", full, ca.path / "y.json", writes=ca)
        after_search(summary, "a later step", full, ca.path / "z.json", writes=ca)
    assert ca.outcome == (f"nothing in {a} changed: writing y.json failed: OSError: [Errno 28] No space left on "
                          f"device: '{a}/y.json'")                      # the staged path in the user's words
    assert cb.outcome is None                                           # another folder's change stands
    assert (a / "x.json").read_text() == "old" and (b / "x.json").read_text() == "new"
    assert len(summary.failures) == 2 and "the same command does it again" in capsys.readouterr().out


def test_a_new_folder_goes_in_whole_and_an_empty_change_leaves_no_output_folder(tmp_path):
    out = tmp_path / "out"
    with TunedFolder(out / "NVIDIA_H200").held() as change:
        (change.begin() / "a.json").write_text("new")
    assert change.outcome is None and (out / "NVIDIA_H200" / "a.json").read_text() == "new"
    assert sorted(p.name for p in out.iterdir()) == ["NVIDIA_H200"]
    other = tmp_path / "other"
    with TunedFolder(other / "NVIDIA_H200").held() as change:
        change.begin()                                                  # nothing written into it
    assert change.outcome is None and not other.exists()                # the run made it: removed again
    mine = tmp_path / "mine"
    mine.mkdir()
    with TunedFolder(mine / "NVIDIA_H200").held() as change:
        change.begin()
    assert mine.is_dir() and list(mine.iterdir()) == []                 # the user's own: kept
    with TunedFolder(mine / "NVIDIA_H200").held():
        pass                                                            # refused before staging anything
    assert mine.is_dir()


def test_two_new_folders_of_one_new_output_folder_one_written(tmp_path):
    """merge-choices' changes: the output folder the first made holds the second's folder; it stays."""
    out = tmp_path / "serving"
    with TunedFolder(out / "NVIDIA_H200").held() as a, TunedFolder(out / "NVIDIA_H100").held() as b:
        b.begin()
        (a.begin() / "server_args.yaml").write_text("tp-size: 8\n")
    assert a.outcome is None is b.outcome
    assert sorted(p.name for p in out.iterdir()) == ["NVIDIA_H200"]


def test_the_same_bytes_written_again_change_nothing(tmp_path):
    folder = _folder(tmp_path, {"provenance.json": '{"files": {}}', "configs/a.json": "same", "validation.json": "v"})
    before, inode = _bytes(folder), folder.stat().st_ino
    with TunedFolder(folder).held() as change:
        (change.begin() / "configs" / "a.json").write_text("same")
    assert change.outcome is None and _bytes(folder) == before          # provenance not rewritten either
    assert folder.stat().st_ino == inode and _leftovers(tmp_path) == []


def test_a_change_records_every_files_sha256_but_provenances_and_validates_outputs(tmp_path):
    import json

    folder = _folder(tmp_path, {"provenance.json": '{"files": {}}', "configs/a.json": "a", "validation.json": "v",
                                "report.md": "r", "validation.png": "p", "validation_runs/run.json": "raw",
                                "configs/validation_runs/x.json": "x", "configs/report.md": "mine"})
    with TunedFolder(folder).held() as change:
        (change.begin() / "configs" / "b.json").write_text("b")
    recorded = json.loads((folder / "provenance.json").read_text())
    assert recorded == {"files": {}, "folder_sha256": {
        "configs/a.json": _sha("a"), "configs/b.json": _sha("b"), "configs/report.md": _sha("mine"),
        "configs/validation_runs/x.json": _sha("x")}}
    assert list(recorded["folder_sha256"]) == sorted(recorded["folder_sha256"])


def test_a_change_without_provenance_or_without_hashes_writes_none(tmp_path):
    import json

    bare = _folder(tmp_path / "bare", {"a.json": "a"})
    with TunedFolder(bare).held() as change:
        (change.begin() / "b.json").write_text("b")
    assert sorted(p.name for p in bare.iterdir()) == ["a.json", "b.json"]
    judged = _folder(tmp_path / "judged", {"provenance.json": '{"files": {}}', "a.json": "a"})
    with TunedFolder(judged).held(record_hashes=False) as change:           # validate's outputs: not vouched for
        (change.begin() / "validation.json").write_text("{}")
    assert json.loads((judged / "provenance.json").read_text()) == {"files": {}}
    assert (judged / "validation.json").read_text() == "{}"


def test_a_provenance_that_cannot_be_written_changes_nothing(tmp_path, monkeypatch):
    folder = _folder(tmp_path, {"provenance.json": '{"files": {}}', "a.json": "old"})
    before = _bytes(folder)

    def full(path, *a, **k):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))
    monkeypatch.setattr(writing, "write_json", full)
    with TunedFolder(folder).held() as change:
        (change.begin() / "a.json").write_text("new")
    assert change.outcome == (f"nothing in {folder} changed: [Errno {errno.ENOSPC}] No space left on device: "
                              f"'{folder}/provenance.json'")
    assert _bytes(folder) == before and _leftovers(tmp_path) == []


@pytest.mark.parametrize("hand", ["edit", "resized, same time", "add", "remove", "a folder"])
def test_any_hand_change_meanwhile_keeps_this_runs_change_aside(tmp_path, hand):
    folder = _folder(tmp_path, {"a.json": "old a", "configs/b.json": "b"})
    with TunedFolder(folder).held() as change:
        s = change.begin()
        (s / "a.json").write_text("ours!")
        st = (folder / "a.json").stat()
        if hand == "edit":
            (folder / "a.json").write_text("old a")                     # the same bytes, written again later
            os.utime(folder / "a.json", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
        elif hand == "resized, same time":
            (folder / "a.json").write_text("old a, longer")
            os.utime(folder / "a.json", ns=(st.st_atime_ns, st.st_mtime_ns))
        elif hand == "add":
            (folder / "configs" / "c.json").write_text("c")
        elif hand == "remove":
            (folder / "configs" / "b.json").unlink()
        else:
            (folder / "configs" / "sub").mkdir()
        hands = _bytes(folder)
    aside = tmp_path / f"NVIDIA_H200.autotune-change-{os.getpid()}"
    assert change.outcome == (f"{folder} was changed by another hand while this run measured: not replaced; "
                              f"this run's change is in {aside} (compare and move it in, or run again)")
    assert _bytes(folder) == hands and (aside / "a.json").read_text() == "ours!"
    assert (aside / "configs" / "b.json").read_text() == "b" and _leftovers(tmp_path) == []


def test_the_swap_is_made_durable_in_the_folders_parent(tmp_path, monkeypatch):
    folder = _folder(tmp_path, {"a.json": "old"})
    synced = []
    real_fsync = os.fsync

    def fsync(fd):
        synced.append(os.fstat(fd).st_ino)
        return real_fsync(fd)
    monkeypatch.setattr(os, "fsync", fsync)
    with TunedFolder(folder).held() as change:
        (change.begin() / "a.json").write_text("new")
    assert tmp_path.stat().st_ino in synced


def test_a_file_system_that_cannot_sync_a_folder_does_not_undo_a_change_already_in(tmp_path, monkeypatch):
    folder = _folder(tmp_path, {"a.json": "old"})

    def fsync(fd):
        raise OSError(errno.EINVAL, "Invalid argument")
    monkeypatch.setattr(os, "fsync", fsync)
    with TunedFolder(folder).held() as change:
        (change.begin() / "a.json").write_text("new")
    assert change.outcome is None and (folder / "a.json").read_text() == "new"


def test_where_the_file_system_exchanges_the_folder_is_never_absent(tmp_path, monkeypatch):
    """One renameat2 RENAME_EXCHANGE: SGLang starting meanwhile finds the old folder or the new, never none
    (the two renames of the fallback leave a moment without one)."""
    folder = _folder(tmp_path, {"a.json": "old"})
    real_rename, renamed = os.rename, []

    def rename(src, dst):
        renamed.append(Path(src))
        return real_rename(src, dst)
    monkeypatch.setattr(os, "rename", rename)
    with TunedFolder(folder).held() as change:
        (change.begin() / "a.json").write_text("new")
    assert change.outcome is None and (folder / "a.json").read_text() == "new"
    assert renamed == [] and _leftovers(tmp_path) == []


def test_a_staged_copy_removed_from_under_the_run_fails_the_change_and_the_folder_stays(tmp_path):
    import shutil

    folder = _folder(tmp_path, {"a.json": "old"})
    before = _bytes(folder)
    with pytest.raises(OSError) as e:
        with TunedFolder(folder).held() as change:
            s = change.begin()
            shutil.rmtree(s)                                            # another hand cleaned the output folder
    assert e.value.errno == errno.ENOENT and str(e.value).startswith(f"[Errno {errno.ENOENT}] cannot swap {s} into")
    assert _bytes(folder) == before


class _Libc:
    """libc as a file system without RENAME_EXCHANGE answers, or one failing it with `err`."""
    def __init__(self, err=None):
        import ctypes

        self.err = err
        if err is None:
            self.renameat2 = None
            ctypes.set_errno(errno.EXDEV)            # an earlier call's errno: not this missing function's

    def renameat2(self, *args):
        import ctypes

        ctypes.set_errno(self.err)
        return -1


@pytest.mark.parametrize("err", [None, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOSYS, 0])
def test_where_the_file_system_cannot_exchange_two_renames_swap_the_change_in(tmp_path, monkeypatch, err):
    import autotune.folder.change as fc

    folder = _folder(tmp_path, {"a.json": "old", "b.json": "b"})
    monkeypatch.setattr(fc.ctypes, "CDLL", lambda *a, **k: _Libc(err))
    with TunedFolder(folder).held() as change:
        (change.begin() / "a.json").write_text("new")
    assert change.outcome is None and (folder / "a.json").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["NVIDIA_H200"]   # neither copy left


@pytest.mark.parametrize("exchange", [True, False], ids=["exchanged", "two renames"])
def test_an_old_copy_that_cannot_be_removed_leaves_the_change_in(tmp_path, monkeypatch, exchange):
    """The change is in once swapped: an old copy left behind (a file busy on NFS) is no failure of it.
    Exchanged, the old copy is a staged one the next writer's lock clears; after two renames it is kept
    as `.old-` (where a writer died between the renames, that is the only copy of the folder)."""
    import autotune.folder.change as fc

    folder = _folder(tmp_path, {"a.json": "old"})
    if not exchange:
        monkeypatch.setattr(fc.ctypes, "CDLL", lambda *a, **k: _Libc(None))
    real_rmdir = os.rmdir

    def rmdir(path, *a, **k):
        if ".staged-" in str(path) or ".old-" in str(path):
            raise OSError(errno.EBUSY, "Device or resource busy", str(path))
        return real_rmdir(path, *a, **k)
    monkeypatch.setattr(os, "rmdir", rmdir)
    with TunedFolder(folder).held() as change:
        (change.begin() / "a.json").write_text("new")
    assert change.outcome is None and (folder / "a.json").read_text() == "new"
    monkeypatch.setattr(os, "rmdir", real_rmdir)
    FolderChange(folder).lock().release()
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == (["NVIDIA_H200"] if exchange else [f".NVIDIA_H200.old-{os.getpid()}", "NVIDIA_H200"])


def test_a_swap_refused_for_another_reason_changes_nothing_and_says_why(tmp_path, monkeypatch):
    import autotune.folder.change as fc

    folder = _folder(tmp_path, {"a.json": "old"})
    before = _bytes(folder)
    monkeypatch.setattr(fc.ctypes, "CDLL", lambda *a, **k: _Libc(errno.EXDEV))
    with pytest.raises(OSError) as e:
        with TunedFolder(folder).held() as change:
            s = change.begin()
            (s / "a.json").write_text("new")
    assert e.value.errno == errno.EXDEV
    assert str(e.value) == f"[Errno {errno.EXDEV}] cannot swap {s} into {folder}: {os.strerror(errno.EXDEV)}"
    assert _bytes(folder) == before and _leftovers(tmp_path) == []


def test_where_the_second_rename_fails_the_old_folder_is_put_back(tmp_path, monkeypatch):
    import autotune.folder.change as fc

    folder = _folder(tmp_path, {"a.json": "old"})
    before = _bytes(folder)
    monkeypatch.setattr(fc.ctypes, "CDLL", lambda *a, **k: _Libc(None))
    real_rename = os.rename

    def rename(src, dst):
        if ".staged-" in str(src) and Path(dst) == folder:
            raise OSError(errno.EIO, "I/O error")
        return real_rename(src, dst)
    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(OSError, match="I/O error"):
        with TunedFolder(folder).held() as change:
            (change.begin() / "a.json").write_text("new")
    assert _bytes(folder) == before and _leftovers(tmp_path) == []


def test_links_in_the_folder_stay_links(tmp_path):
    folder = _folder(tmp_path, {"configs/a.json": "a"})
    (folder / "latest.json").symlink_to("configs/a.json")
    with TunedFolder(folder).held() as change:
        (change.begin() / "b.json").write_text("b")
    assert (folder / "latest.json").is_symlink() and os.readlink(folder / "latest.json") == "configs/a.json"


def test_folder_sha256_reads_regular_files_only_and_sets_validates_outputs_aside_at_the_top(tmp_path):
    from autotune.folder.change import folder_sha256

    folder = _folder(tmp_path, {"b.json": "b", "a/report.md": "r", "validation.json": "v", "report.md": "r",
                                "validation.png": "p", "validation_runs/x.json": "x", "a/validation_runs/y": "y",
                                "provenance.json": "{}", "a/provenance.json": "p"})
    (folder / "broken").symlink_to("nowhere")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "e.json").write_text("e")
    (folder / "linked").symlink_to(tmp_path / "elsewhere")
    os.mkfifo(folder / "fifo")
    everything = {"a/provenance.json": _sha("p"), "a/report.md": _sha("r"), "a/validation_runs/y": _sha("y"),
                  "b.json": _sha("b"), "provenance.json": _sha("{}"), "report.md": _sha("r"),
                  "validation.json": _sha("v"), "validation.png": _sha("p"), "validation_runs/x.json": _sha("x")}
    assert folder_sha256(folder, outputs_aside=False) == everything
    assert list(folder_sha256(folder, outputs_aside=False)) == sorted(everything)
    kept = {k: v for k, v in everything.items()
            if k not in ("report.md", "validation.json", "validation.png", "validation_runs/x.json")}
    assert folder_sha256(folder) == kept
    assert TunedFolder(folder).vouched_hashes() == {k: v for k, v in kept.items() if k != "provenance.json"}


def test_unvouched_names_each_file_added_changed_or_missing(tmp_path):
    folder = _folder(tmp_path, {"configs/a.json": "a", "configs/b.json": "b", "notes.txt": "n", "z.json": "z",
                                "provenance.json": "{}"})
    tuned = TunedFolder(folder)
    assert tuned.unvouched({"files": {}}) == [] and tuned.unvouched({"folder_sha256": "all"}) == []
    recorded = tuned.vouched_hashes()
    assert tuned.unvouched({"folder_sha256": recorded}) == []
    (folder / "configs" / "b.json").write_text("b by hand")
    (folder / "z.json").write_text("z by hand")
    (folder / "z.json").rename(folder / "y.json")
    (folder / "configs" / "c.json").write_text("c")
    (folder / "notes.txt").unlink()
    (folder / "extra.md").write_text("e")
    (folder / "provenance.json").write_text("{'rewritten': 1}")          # its own hash is never listed
    assert tuned.unvouched({"folder_sha256": recorded}) == [
        ("configs/c.json",
         "not written by autotune (provenance.json does not list it): SGLang would load it unchecked"),
        ("extra.md", "not written by autotune (provenance.json does not list it)"),
        ("y.json", "not written by autotune (provenance.json does not list it)"),
        ("configs/b.json", "changed since autotune wrote it (its sha256 is not the one provenance.json records)"),
        ("notes.txt", "written by autotune but missing"),
        ("z.json", "written by autotune but missing"),
    ]
