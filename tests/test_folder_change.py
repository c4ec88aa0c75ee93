"""A tuned folder changes as one (autotune/folder/change.py): a write that fails anywhere in a command's
change set leaves the folder byte-identical; one writer at a time; a folder changed by another hand
while a run measured is not swapped over."""
import errno
import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.fileio import writing
from autotune.cli import main
from autotune.folder.change import FolderChange, folder_change, staged
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
    with folder_change(folder) as change:
        s = change.begin()
        assert staged(folder) == s != folder
        (s / "configs" / "a.json").write_text("new a")
        (s / "c.json").write_text("new c")
        (s / "b.json").unlink()
        assert (folder / "configs" / "a.json").read_text() == "old a"     # nothing seen before the swap
    assert change.outcome is None
    assert _bytes(folder).keys() == {"configs", "configs/a.json", "c.json"}
    assert (folder / "configs" / "a.json").read_text() == "new a"
    assert _leftovers(tmp_path) == [] and staged(folder) == folder


def test_a_failed_write_throws_the_whole_change_away(tmp_path):
    folder = tmp_path / "NVIDIA_H200"
    folder.mkdir()
    (folder / "a.json").write_text("old a")
    before = _bytes(folder)
    with folder_change(folder) as change:
        s = change.begin()
        (s / "a.json").write_text("new a")
        change.fail("writing b.json failed: No space left on device")
    assert "nothing in" in change.outcome and "No space left" in change.outcome
    assert _bytes(folder) == before and _leftovers(tmp_path) == []


def test_an_error_inside_the_change_throws_it_away(tmp_path):
    folder = tmp_path / "new_folder"
    with pytest.raises(KeyboardInterrupt):
        with folder_change(folder) as change:
            (change.begin() / "a.json").write_text("x")
            raise KeyboardInterrupt
    assert not folder.exists() and _leftovers(tmp_path) == []


def test_a_second_writer_is_refused_while_the_first_holds_the_folder(tmp_path):
    folder = tmp_path / "NVIDIA_H200"
    with folder_change(folder):
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
    with folder_change(folder) as change:
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
    return _run(root, "8,16"), root / "out"            # adds a batch size: configs, SKU copies, provenance


def _setup_export(root: Path):
    assert main(_run(root, "8,16")) == 0
    assert main(_export(root, "8")) == 0
    return _export(root, "8,16"), root / "exported"


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
