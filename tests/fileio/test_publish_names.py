"""The names a tuned folder gives (provenance.json's file names, `_down` files, Triton versions, the
shipped overlay's paths) are joined to folders to read, write, copy and remove files: each is checked
where provenance is parsed, so every command that reads one refuses it in one line, and what writes
or removes resolves its target inside its folder (a link out of it is refused too)."""
import json
import os
import shutil
import subprocess

import pytest

from autotune.cli import main
from autotune.fileio.writing import Outside, listed
from tests.conftest import GRID, ROOT
from tests.fakes.tuned_folders import DEV, UP, git, tuned

H200 = ROOT / "tuned_configs/NVIDIA_H200"
H200_UP = "E=512,N=128,device_name=NVIDIA_H200.json"


def _rename(prov, name):
    prov["files"][name] = prov["files"].pop(H200_UP)


EDITS = {    # where a name goes -> put it there
    "file-name": _rename,
    "down-file": lambda prov, name: prov["files"][H200_UP].update(down_file=name),
    "triton": lambda prov, name: prov["files"][H200_UP].update(triton=name),
    "overlay": lambda prov, name: prov["shipped_overlay"]["files"].append(name),
}
BAD = [("file-name", "../../victim.json"), ("file-name", "/tmp/victim.json"), ("down-file", "configs/victim.json"),
       ("down-file", ""), ("triton", "a\\b"), ("triton", ".."), ("overlay", "../../victim.json"),
       ("overlay", "/tmp/victim.json"), ("overlay", "configs\\victim.json")]


def _argv(command, folder, root):
    if command == "publish":
        subprocess.run(["git", "init", "-q", "-b", "main", str(root / "serving")], check=True)
        git(root / "serving", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "i")
    return {"check": ["check", str(folder), "--sglang-version", "0.5.23"],
            "only-drifted": ["run", "--only-drifted", str(folder), "--replay", str(GRID), "--dry-run",
                             "--sglang-version", "0.5.16"],
            "publish": ["publish", "--to", str(root / "serving"), "--from", str(folder)]}[command]


@pytest.mark.parametrize("where,name", BAD)
@pytest.mark.parametrize("command", ["check", "only-drifted", "publish"])
def test_every_command_that_reads_provenance_refuses_a_name_outside_its_folder(tmp_path, capsys, where, name, command):
    folder = tmp_path / "NVIDIA_H200"
    shutil.copytree(H200, folder)
    prov = json.loads((folder / "provenance.json").read_text())
    EDITS[where](prov, name)
    (folder / "provenance.json").write_text(json.dumps(prov))
    argv = _argv(command, folder, tmp_path)
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "provenance.json is not autotune provenance" in err[0], err
    assert {"overlay": "is not a path inside the folder", "triton": "is not a Triton version"}.get(
        where, "is not a plain file name") in err[0], err


def test_an_overlay_naming_a_file_outside_its_folder_removes_nothing(tmp_path):
    """overlay_shipped removes an earlier overlay's copies it no longer wants: a name out of the
    folder (or a folder linked out of it) would have removed the user's file there."""
    from autotune.families.triton_moe.overlay import overlay_shipped
    from autotune.folder.tuned import TunedFolder
    from autotune.fileio.writing import FileFormatError

    victim = tmp_path / "victim.json"
    victim.write_text('{"mine": true}\n')
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere/victim.json").write_text('{"mine": true}\n')
    builtin = tmp_path / "builtin"
    (builtin / "configs/triton_3_6_0").mkdir(parents=True)
    for n, rel in enumerate(("../../../victim.json", "configs/linked/victim.json")):
        src = tuned(tmp_path, f"t{n}", {1: 10.0})
        os.symlink(tmp_path / "elsewhere", src / "configs/linked")       # plain names, a folder linked out
        prov = json.loads((src / "provenance.json").read_text())
        prov["shipped_overlay"] = {"files": [rel]}
        (src / "provenance.json").write_text(json.dumps(prov))
        with pytest.raises(FileFormatError, match="is not a path inside the folder" if ".." in rel else
                           "names a file outside"):
            overlay_shipped(TunedFolder(src, DEV), ("0.5.23",), builtin=builtin, sglang_version="0.5.23")
    assert victim.read_text() == (tmp_path / "elsewhere/victim.json").read_text() == '{"mine": true}\n'


def test_publish_refuses_a_target_behind_a_link_out_of_the_serving_repo(tmp_path, capsys):
    """The names pass the schema; the serving repo's own Triton folder is a link out of it."""
    repo = tmp_path / "serving"
    dest = repo / f"tuned_configs/{DEV.file_name}/configs"
    dest.mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", dest / "triton_3_6_0")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "a link out")
    src = tuned(tmp_path, "a", {1: 10.0})
    assert main(["publish", "--to", str(repo), "--from", str(src)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"'configs/triton_3_6_0/{UP}' names a file outside" in err[0], err
    assert not list((tmp_path / "elsewhere").iterdir())
    assert git(repo, "rev-parse", "--abbrev-ref", "HEAD") == "main" and git(repo, "status", "--porcelain") == ""


def test_publish_refuses_a_listed_file_sglang_would_not_load(tmp_path, capsys):
    repo = tmp_path / "serving"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "init")
    src = tuned(tmp_path, "a", {1: 10.0})
    (src / "configs/triton_3_6_0" / UP).write_text(json.dumps({"one": {"BLOCK_SIZE_M": 16}}))
    assert main(["publish", "--to", str(repo), "--from", str(src)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "key 'one' is not a batch size" in err[0] and err[0].endswith("; not published"), err
    assert git(repo, "branch", "--list") == "* main"


def test_listed_names_a_path_relative_to_its_folder_exactly(tmp_path):
    ours = listed(["configs/triton_3_6_0/x.json", "config.json"], tmp_path)
    assert ours(tmp_path / "configs/triton_3_6_0/x.json") and ours(tmp_path / "config.json")
    for other in ("sub/config.json", "other/configs/triton_3_6_0/x.json", "x.json", "configs/triton_3_5_1/x.json"):
        assert not ours(tmp_path / other), other           # a name matched by its end claimed these
    assert not ours(tmp_path.parent / "config.json")
    with pytest.raises(Outside):
        from autotune.fileio.writing import inside
        inside(tmp_path, "../config.json")
