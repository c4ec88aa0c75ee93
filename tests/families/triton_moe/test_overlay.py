"""The exported folder overlays SGLang's shipped files: with SGLANG_MOE_CONFIG_DIR at it, SGLang's
own loader finds our file for the tuned shape and its shipped file for every other shape."""
import json
from pathlib import Path

import pytest

from autotune.cli import main
from autotune.families.triton_moe.overlay import overlay_shipped
from autotune.folder.tuned import TunedFolder
from autotune.adapters.sglang_loader import builtin_config_dir, sglang_selection
from autotune.problems.models import Problem
from tests.conftest import GRID

TUNED = "E=512,N=128,device_name=NVIDIA_H200.json"


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("overlay")
    assert main(["run", "--model", "qwen3.5-397b-a17b", "--tp", "8", "--dtype", "bf16", "--kernels", "triton_moe",
                 "--replay", str(GRID), "--batch-sizes", "1,8", "--trials", "4", "--out", str(tmp / "out"),
                 "--storage", f"sqlite:///{tmp / 'a.db'}", "--quiet"]) == 0
    return tmp / "out/NVIDIA_H200"


def test_tuned_shape_resolves_to_ours_and_shipped_only_shape_to_sglangs(exported, h200):
    ours = json.loads((exported / "configs/triton_3_6_0" / TUNED).read_text())
    tuned = Problem(512, 128, 4096, 10, "bf16", (1, 8))
    for M in (1, 8):
        up, _, found = sglang_selection(tuned, M, h200, config_dir=str(exported))
        assert found and up == {k: v for k, v in ours[str(M)].items()}
    shipped_only = Problem(512, 256, 4096, 10, "bf16", (1, 8))       # Qwen3.5-397B at TP4: never tuned here
    for M in (1, 8, 512):
        via_ours = sglang_selection(shipped_only, M, h200, config_dir=str(exported))
        via_sglang = sglang_selection(shipped_only, M, h200)
        assert via_ours[2] and via_ours == via_sglang
    prov = json.loads((exported / "provenance.json").read_text())
    assert list(prov["files"]) == [TUNED]                              # ours, and only ours
    assert prov["shipped_overlay"]["sglang"] == "0.5.23" and prov["shipped_overlay"]["files"]


def test_no_shipped_copy_of_a_tuned_file_in_any_triton_folder(exported):
    names = [p.relative_to(exported).as_posix() for p in (exported / "configs").glob("*/*") if p.name == TUNED]
    assert names == [f"configs/triton_3_6_0/{TUNED}"]
    skipped = json.loads((exported / "provenance.json").read_text())["shipped_overlay"]["skipped"]
    assert any(k.endswith(TUNED) and "tuned here" in v for k, v in skipped.items())


def test_shipped_files_an_older_target_cannot_run_stay_out(exported, h200, tmp_path):
    src = tmp_path / "sglang_builtin"
    (src / "configs/triton_3_6_0").mkdir(parents=True)
    tma_up = {"1": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1,
                    "num_warps": 4, "num_stages": 3, "USE_TMA": True}}
    plain = {"1": {k: v for k, v in tma_up["1"].items() if k != "USE_TMA"}}
    (src / "configs/triton_3_6_0/E=64,N=32,device_name=NVIDIA_H200.json").write_text(json.dumps(tma_up))
    (src / "configs/triton_3_6_0/E=64,N=64,device_name=NVIDIA_H200.json").write_text(json.dumps(plain))
    (src / "configs/triton_3_6_0/E=64,N=64,device_name=NVIDIA_H200_NVL.json").write_text(json.dumps(plain))
    folder = tmp_path / "NVIDIA_H200"
    rec = overlay_shipped(TunedFolder(folder, h200), ("0.5.16",), builtin=src, sglang_version="0.5.23")
    assert rec["files"] == ["configs/triton_3_6_0/E=64,N=64,device_name=NVIDIA_H200.json"]   # not the NVL SKU's
    assert "0.5.16 cannot run it" in rec["skipped"]["configs/triton_3_6_0/E=64,N=32,device_name=NVIDIA_H200.json"]
    # Re-run for a newer target: the TMA file comes in; a user's own file of a shipped name is never replaced.
    user = folder / "configs/triton_3_6_0/E=64,N=64,device_name=NVIDIA_H200.json"
    rec = overlay_shipped(TunedFolder(folder, h200), ("0.5.23",), builtin=src, sglang_version="0.5.23")
    assert "configs/triton_3_6_0/E=64,N=32,device_name=NVIDIA_H200.json" in rec["files"]
    assert builtin_config_dir()
    (folder / "provenance.json").write_text(json.dumps({"files": {}}))   # forget that the overlay wrote it
    user.write_text('{"1": {"mine": 1}}')
    rec = overlay_shipped(TunedFolder(folder, h200), ("0.5.23",), builtin=src, sglang_version="0.5.23")
    assert json.loads(user.read_text()) == {"1": {"mine": 1}} and "not ours to replace" in rec["skipped"][
        "configs/triton_3_6_0/E=64,N=64,device_name=NVIDIA_H200.json"]


def test_sku_names_resolve_in_sglangs_loader_and_say_where_they_were_measured(tmp_path, h200, capsys):
    import dataclasses

    out = tmp_path / "out"
    assert main(["run", "--model", "qwen3.5-397b-a17b", "--tp", "8", "--dtype", "bf16", "--kernels", "triton_moe",
                 "--replay", str(GRID), "--batch-sizes", "1,8", "--trials", "4", "--out", str(out),
                 "--storage", f"sqlite:///{tmp_path / 'a.db'}", "--quiet", "--device-name", "NVIDIA H200 NVL"]) == 0
    folder = out / "NVIDIA_H200"
    nvl = dataclasses.replace(h200, name="NVIDIA H200 NVL")
    p = Problem(512, 128, 4096, 10, "bf16", (1, 8))
    for M in (1, 8):
        assert sglang_selection(p, M, nvl, config_dir=str(folder)) == sglang_selection(p, M, h200, config_dir=str(folder))
    prov = json.loads((folder / "provenance.json").read_text())["files"]
    copy = prov["E=512,N=128,device_name=NVIDIA_H200_NVL.json"]
    assert copy["measured_on_sku"] == "NVIDIA H200" and copy["device"] == "NVIDIA H200 NVL"
    assert "measured_on_sku" not in prov[TUNED]
    capsys.readouterr()
    for name, says in (("NVIDIA H100 PCIe", "another chip"), ("E=1,N=2", "not a plausible"), ("", "not a plausible")):
        fresh = tmp_path / f"x{len(name)}"
        rc = main(["run", "--model", "qwen3.5-397b-a17b", "--tp", "8", "--dtype", "bf16", "--kernels", "triton_moe",
                   "--replay", str(GRID), "--batch-sizes", "1", "--out", str(fresh), "--storage",
                   f"sqlite:///{tmp_path / 'b.db'}", "--quiet", "--device-name", name])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and says in err[0], (name, err)
        assert not list(fresh.rglob("*.json"))


def test_an_emptied_copy_is_said_before_measuring_and_copied_again_under_force(tmp_path, capsys):
    """A shipped copy emptied after export would crash the server reading the folder: the next run
    refuses before measuring (a changed copy is the user's), --force copies SGLang's file again."""
    run = ["run", "--model", "qwen3.5-397b-a17b", "--tp", "8", "--dtype", "bf16", "--kernels", "triton_moe",
           "--replay", str(GRID), "--batch-sizes", "8", "--trials", "2", "--out", str(tmp_path / "out"),
           "--storage", f"sqlite:///{tmp_path / 'a.db'}", "--quiet"]
    assert main(run) == 0
    folder = tmp_path / "out/NVIDIA_H200"
    rel = json.loads((folder / "provenance.json").read_text())["shipped_overlay"]["files"][0]
    shipped = (Path(builtin_config_dir()) / rel).read_bytes()
    (folder / rel).write_text("")
    capsys.readouterr()
    assert main(run) == 2
    assert "changed since and not valid JSON" in capsys.readouterr().err
    assert (folder / rel).read_text() == ""
    assert main([*run, "--force"]) == 0
    assert (folder / rel).read_bytes() == shipped
