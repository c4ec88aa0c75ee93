"""The exported files are read by SGLang's own loader exactly as it reads its shipped ones."""
import json

import pytest

from autotune.contract.config import KernelConfig
from autotune.gpus.device import DeviceInfo
from autotune.families.triton_moe.export import export_problem
from autotune.folder.tuned import TunedFolder
from autotune.adapters.sglang_loader import sglang_file_name, sglang_selection
from autotune.families.triton_moe import TritonMoe
from autotune.problems.models import Problem
from autotune.search.finalists import Choice

UP = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4, "num_stages": 4}
DOWN = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 32, "num_warps": 8, "num_stages": 3,
        "USE_TMA": True}
BIG = {"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 32, "num_warps": 8, "num_stages": 3}


def _tuned(out, device) -> TunedFolder:
    """The device's tuned folder under `out`, as a command opens it."""
    return TunedFolder.under(out, device)


def _choice(M, up, down, t=10.0):
    return Choice.pair(M, (KernelConfig.from_entry(up), KernelConfig.from_entry(down)), (t / 2, t / 2), "tuned",
                       {"default": 2 * t, "shipped": None})


@pytest.fixture
def rtx():
    return DeviceInfo("NVIDIA RTX PRO 6000 Blackwell Server Edition", 120, 101376, versions={"triton": "3.6.0"})


def test_file_names_are_sglangs(rtx):
    p = Problem(512, 128, 4096, 10, "fp8_w8a8_block")
    assert sglang_file_name(p, rtx) == (
        "E=512,N=128,device_name=NVIDIA_RTX_PRO_6000_Blackwell_Server_Edition,dtype=fp8_w8a8,block_shape=[128, 128].json")
    assert sglang_file_name(p, rtx, down=True).endswith("block_shape=[128, 128]_down.json")
    assert sglang_file_name(Problem(512, 128, 4096, 10, "bf16"), rtx).endswith("Server_Edition.json")


def test_sglang_loader_reads_export_and_picks_the_tuned_config_per_M(tmp_path, rtx):
    p = Problem(512, 128, 4096, 10, "fp8_w8a8_block", batch_sizes=(1, 64, 4096))
    choices = {1: _choice(1, UP, DOWN), 64: _choice(64, UP, {**DOWN, "USE_TMA": False}),
               4096: _choice(4096, BIG, {**BIG, "BLOCK_SIZE_N": 64})}
    export_problem(_tuned(tmp_path, rtx), p, choices, {})
    folder = _tuned(tmp_path, rtx).config_dir()
    assert folder.name == "triton_3_6_0"
    for M, want_up, want_down in [(1, UP, DOWN), (2, UP, DOWN), (64, UP, None), (3000, BIG, None)]:
        up, down, found = sglang_selection(p, M, rtx, config_dir=str(tmp_path / rtx.file_name))
        assert found
        assert up == want_up                      # nearest key, as SGLang picks it
        assert down["BLOCK_SIZE_M"] == up["BLOCK_SIZE_M"]
        if want_down:
            assert down == want_down              # the _down file, TMA flag included
    assert json.loads((folder / sglang_file_name(p, rtx)).read_text()).keys() == {"1", "64", "4096"}


def test_sglang_falls_back_to_our_folder_under_another_triton(tmp_path, rtx, monkeypatch):
    """A server with a different Triton still finds the file (SGLang's newest-other-version rule)."""
    import triton

    from autotune.adapters.sglang_loader import sglang_config_module

    p = Problem(512, 128, 4096, 10, "bf16", batch_sizes=(8,))
    export_problem(_tuned(tmp_path, rtx), p, {8: _choice(8, UP, UP)}, {})
    mod = sglang_config_module()
    assert triton.__version__ != "3.6.0"
    monkeypatch.setenv("SGLANG_MOE_CONFIG_DIR", str(tmp_path / rtx.file_name))
    monkeypatch.setattr(mod, "get_device_name", lambda *a: rtx.name)
    from autotune.adapters.sglang_loader import sglang_context
    from sglang.srt import runtime_context as rc

    mod.get_moe_configs.cache_clear()
    with rc.use_context(sglang_context()):
        configs = mod.get_moe_configs(512, 128, None)
    mod.get_moe_configs.cache_clear()
    assert configs == {8: UP}


def test_baselines_are_sglangs_default_and_shipped_files(h200, rtx):
    fam = TritonMoe()
    p = Problem(512, 128, 4096, 10, "bf16")
    b = fam.baselines(p, 8, h200)
    # SGLang's bf16 default for M <= E, and its shipped H200 file (found through its Triton fallback)
    assert b["default"]["gate_up"].to_entry() == {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1}
    assert "shipped" in b and b["shipped"]["gate_up"] != b["default"]["gate_up"]
    # No file ships for this shape on the RTX PRO 6000: the default is what users get there
    assert "shipped" not in fam.baselines(p, 8, rtx)


def test_fp8_default_follows_the_devices_shared_memory(h200, rtx):
    """SGLang has a separate per-tensor FP8 default for GPUs under 128 KB of shared memory."""
    fam = TritonMoe()
    p = Problem(512, 128, 4096, 10, "fp8_w8a8")
    assert fam.baselines(p, 8, h200)["default"]["gate_up"] != fam.baselines(p, 8, rtx)["default"]["gate_up"]


def test_export_keeps_a_better_existing_entry(tmp_path, rtx):
    p = Problem(512, 128, 4096, 10, "bf16", batch_sizes=(1, 8))
    export_problem(_tuned(tmp_path, rtx), p, {1: _choice(1, UP, UP, t=10.0), 8: _choice(8, UP, UP, t=30.0)}, {})
    worse = {**UP, "BLOCK_SIZE_N": 32}
    summary = export_problem(_tuned(tmp_path, rtx), p, {1: _choice(1, worse, worse, t=12.0), 8: _choice(8, BIG, BIG, t=20.0)}, {})
    assert list(summary["kept"]) == [1]
    assert _files(tmp_path, rtx, p)[2]["kept_existing"] == {"1": "existing 10.00 us beats new 12.00 us"}
    data = json.loads((_tuned(tmp_path, rtx).config_dir() / sglang_file_name(p, rtx)).read_text())
    assert data["1"] == UP and data["8"] == BIG



def test_an_entry_timed_under_another_triton_is_never_kept_as_faster(tmp_path, rtx):
    """The keep rule compares times taken on the same GPU and Triton only: a folder last exported under
    Triton 3.5.1 (1 us) holds no verdict on a 3.6.0 measurement, even where 3.6.0's older file, with the
    same bytes, is there and replaced under --force."""
    from autotune.fileio.writing import forcing

    p = Problem(512, 128, 4096, 10, "bf16", batch_sizes=(1, 8))
    older = DeviceInfo(rtx.name, rtx.sm, rtx.smem_optin, versions={"triton": "3.5.1"})
    export_problem(_tuned(tmp_path, rtx), p, {M: _choice(M, UP, UP, t=20.0) for M in (1, 8)}, {})
    export_problem(_tuned(tmp_path, older), p, {M: _choice(M, UP, UP, t=1.0) for M in (1, 8)}, {})
    with forcing(True):          # 3.6.0's file is no longer the one provenance lists
        summary = export_problem(_tuned(tmp_path, rtx), p, {M: _choice(M, BIG, BIG, t=10.0) for M in (1, 8)}, {})
    assert summary["kept"] == {}
    up, _, entry = _files(tmp_path, rtx, p)
    assert up == {"1": BIG, "8": BIG} and entry["triton"] == "3.6.0"
    assert {M: rec["tuned_us"] for M, rec in entry["per_M"].items()} == {"1": 10.0, "8": 10.0}

def test_failed_write_leaves_existing_file_intact(tmp_path, rtx, monkeypatch):
    from autotune.fileio import writing

    p = Problem(512, 128, 4096, 10, "bf16", batch_sizes=(1,))
    export_problem(_tuned(tmp_path, rtx), p, {1: _choice(1, UP, UP)}, {})
    target = _tuned(tmp_path, rtx).config_dir() / sglang_file_name(p, rtx)
    before = target.read_text()
    real_replace = writing.os.replace

    def boom(src, dst):
        raise OSError("disk full")
    monkeypatch.setattr(writing.os, "replace", boom)
    with pytest.raises(OSError):
        export_problem(_tuned(tmp_path, rtx), p, {1: _choice(1, BIG, BIG, t=1.0)}, {})
    monkeypatch.setattr(writing.os, "replace", real_replace)
    assert target.read_text() == before
    assert not [f for f in target.parent.iterdir() if f.name.startswith(".")]   # no temp litter


def test_replay_results_are_never_mixed_into_gpu_measured_files(tmp_path, rtx):
    from autotune.families.triton_moe.export import ExportError

    p = Problem(512, 128, 4096, 10, "bf16", batch_sizes=(1,))
    export_problem(_tuned(tmp_path, rtx), p, {1: _choice(1, UP, UP, t=10.0)}, {})
    replayed = DeviceInfo(**{**rtx.__dict__, "kind": "replay"})
    with pytest.raises(ExportError, match="not mixed"):
        export_problem(_tuned(tmp_path, replayed), p, {1: _choice(1, BIG, BIG, t=1.0)}, {})


def _files(tmp_path, rtx, p) -> tuple[dict, dict, dict]:
    """(gate_up file, down file, provenance entry) of `p`."""
    folder = _tuned(tmp_path, rtx).config_dir()
    up, down = (json.loads((folder / sglang_file_name(p, rtx, down=d)).read_text()) for d in (False, True))
    prov = json.loads((tmp_path / rtx.file_name / "provenance.json").read_text())
    return up, down, prov["files"][sglang_file_name(p, rtx)]


def test_provenance_holds_each_ms_re_measured_times_as_written(tmp_path, rtx):
    from autotune.fileio.writing import sha256

    p = Problem(512, 128, 4096, 10, "bf16", batch_sizes=(8,))
    c = Choice.pair(8, (KernelConfig.from_entry(UP), KernelConfig.from_entry(DOWN)), (4.12345, 6.00049), "shipped", {"default": 12.34567, "shipped": None})
    summary = export_problem(_tuned(tmp_path, rtx), p, {8: c}, {"per_M": {8: {"trials": 40}}, "budget": "400s"})
    up, down, entry = _files(tmp_path, rtx, p)
    folder = _tuned(tmp_path, rtx).config_dir()
    assert summary == {"files": [str(folder / sglang_file_name(p, rtx)), str(folder / entry["down_file"])], "kept": {},
                       "missing": []}
    assert {k: entry[k] for k in ("problem", "compute_capability", "driver", "versions", "replay_note")} == {
        "problem": p.to_dict(), "compute_capability": rtx.sm, "driver": rtx.driver, "versions": rtx.versions,
        "replay_note": ""}
    prov = json.loads((tmp_path / rtx.file_name / "provenance.json").read_text())
    assert prov["device"] == rtx.to_dict() and entry["date"]
    assert up == {"8": UP} and down == {"8": {**DOWN, "BLOCK_SIZE_M": UP["BLOCK_SIZE_M"]}}
    assert entry["per_M"] == {"8": {"tuned_us": 10.124, "gate_up_us": 4.123, "down_us": 6.0, "source": "shipped",
                                    "default_us": 12.346, "shipped_us": None, "trials": 40}}
    assert entry["run"] == {"budget": "400s"} and entry["kept_existing"] == {}
    assert (entry["device"], entry["triton"], entry["measured_on"]) == (rtx.name, "3.6.0", rtx.kind)
    assert entry["sha256"] == {n: sha256(folder / n) for n in (sglang_file_name(p, rtx), entry["down_file"])}
    replayed = DeviceInfo(**{**rtx.__dict__, "kind": "replay"})
    export_problem(_tuned(tmp_path / "replay", replayed), p, {8: c}, {})
    assert _files(tmp_path / "replay", replayed, p)[2]["replay_note"].startswith("replayed from a recorded")


def test_a_rerun_keeps_every_m_it_did_not_measure_with_its_provenance(tmp_path, rtx):
    p = Problem(512, 128, 4096, 10, "bf16", batch_sizes=(1, 8))
    export_problem(_tuned(tmp_path, rtx), p, {1: _choice(1, UP, UP, t=10.0), 8: _choice(8, BIG, BIG, t=30.0)},
                   {"per_M": {1: {"trials": 40}}})
    first = _files(tmp_path, rtx, p)[2]["per_M"]
    summary = export_problem(_tuned(tmp_path, rtx), p, {8: _choice(8, UP, UP, t=20.0)}, {})
    up, down, entry = _files(tmp_path, rtx, p)
    assert up == {"1": UP, "8": UP} and set(down) == {"1", "8"}
    assert entry["per_M"]["1"] == first["1"] and entry["per_M"]["8"]["tuned_us"] == 20.0
    assert summary["kept"] == {}


def test_an_existing_entry_the_target_releases_cannot_run_is_never_kept(tmp_path, rtx):
    # SGLang 0.5.16 passes the up-projection config to the kernel as it is: USE_TMA there crashes it
    p = Problem(512, 128, 4096, 10, "bf16", batch_sizes=(1, 8, 16))
    tma_up = {**UP, "USE_TMA": True}
    export_problem(_tuned(tmp_path, rtx), p, {M: _choice(M, tma_up if M < 16 else UP, UP, t=5.0) for M in (1, 8, 16)}, {})
    summary = export_problem(_tuned(tmp_path, rtx), p, {1: _choice(1, UP, UP, t=50.0)}, {}, targets=("0.5.16",))
    up, _, entry = _files(tmp_path, rtx, p)
    # M=1: replaced though slower; M=8: dropped (nothing new, and 0.5.16 cannot run it); M=16: kept as it was
    assert up == {"1": UP, "16": UP} and summary["kept"] == {}
    assert entry["per_M"]["1"]["tuned_us"] == 50.0 and entry["per_M"]["16"]["tuned_us"] == 5.0
    assert "0.5.16" in entry["sglang_versions"] and entry["sglang_targets"] == ["0.5.16"]


@pytest.mark.parametrize("broken, why", [("{", "not valid JSON"),
                                         ('{"1": {"BLOCK_SIZE_M": "x"}, "8": {"BLOCK_SIZE_M": "x"}}', "M=1")])
def test_a_broken_file_an_earlier_export_wrote_is_not_merged_into_and_replaced_only_under_force(tmp_path, rtx,
                                                                                                 broken, why):
    from autotune.families.triton_moe.export import ExportError
    from autotune.fileio.writing import forcing

    p = Problem(512, 128, 4096, 10, "bf16", batch_sizes=(1, 8))
    export_problem(_tuned(tmp_path, rtx), p, {1: _choice(1, UP, UP), 8: _choice(8, UP, UP)}, {})
    target = _tuned(tmp_path, rtx).config_dir() / sglang_file_name(p, rtx)
    target.write_text(broken)
    with pytest.raises(ExportError, match=f"{target.name}: {why}.*it is not merged into"):
        export_problem(_tuned(tmp_path, rtx), p, {1: _choice(1, BIG, BIG, t=1.0)}, {})
    assert target.read_text() == broken
    with forcing(True):
        export_problem(_tuned(tmp_path, rtx), p, {1: _choice(1, BIG, BIG, t=1.0)}, {})
    up, down, _ = _files(tmp_path, rtx, p)
    # the broken gate_up file replaced; M=8's down entry goes with it (a pair is kept whole or not at all)
    assert up == {"1": BIG} and set(down) == {"1"}


def test_a_merge_that_would_not_run_in_a_target_release_writes_nothing(tmp_path, rtx):
    from autotune.families.triton_moe.export import ExportError

    p = Problem(512, 128, 4096, 10, "bf16", batch_sizes=(1,))
    with pytest.raises(ExportError, match=r"would not run in SGLang 0.5.16, 0.5.17; nothing written"):
        export_problem(_tuned(tmp_path, rtx), p, {1: _choice(1, {**UP, "USE_TMA": True}, UP)}, {}, targets=("0.5.16", "0.5.17"))
    assert not (tmp_path / rtx.file_name).exists()


def test_a_down_file_gone_since_the_last_export_drops_its_pairs_and_a_tma_down_entry_stays_where_tma_runs(tmp_path, rtx):
    p = Problem(512, 128, 4096, 10, "bf16", batch_sizes=(1, 8))
    export_problem(_tuned(tmp_path, rtx), p, {1: _choice(1, UP, DOWN, t=5.0), 8: _choice(8, UP, DOWN, t=5.0)}, {})
    # SGLang 0.5.16 runs a down config's USE_TMA on a GPU with TMA descriptors (this SM120 card): kept though faster
    summary = export_problem(_tuned(tmp_path, rtx), p, {1: _choice(1, BIG, BIG, t=50.0)}, {}, targets=("0.5.16",))
    up, down, _ = _files(tmp_path, rtx, p)
    assert summary["kept"] == {1: "existing 5.00 us beats new 50.00 us"} and down["1"]["USE_TMA"] is True
    (_tuned(tmp_path, rtx).config_dir() / sglang_file_name(p, rtx, down=True)).unlink()
    export_problem(_tuned(tmp_path, rtx), p, {1: _choice(1, BIG, BIG, t=50.0)}, {})
    up, down, _ = _files(tmp_path, rtx, p)
    assert set(up) == set(down) == {"1"} and up["1"] == BIG         # no down entry: no pair to keep


def test_a_hand_edited_file_is_not_merged_into_and_the_ms_left_without_an_entry_are_named(tmp_path, rtx):
    from autotune.families.triton_moe.export import ExportError

    p = Problem(512, 128, 4096, 10, "bf16", batch_sizes=(1, 8, 64))
    summary = export_problem(_tuned(tmp_path, rtx), p, {1: _choice(1, UP, UP), 8: _choice(8, UP, UP)}, {})
    assert summary["missing"] == [64]
    target = _tuned(tmp_path, rtx).config_dir() / sglang_file_name(p, rtx)
    edited = json.dumps({"1": BIG, "8": UP})              # valid, and one SGLang would load: not what was measured
    target.write_text(edited)
    with pytest.raises(ExportError, match="changed since autotune wrote it"):
        export_problem(_tuned(tmp_path, rtx), p, {64: _choice(64, UP, UP)}, {})
    assert target.read_text() == edited


def test_every_written_entry_states_num_warps_and_num_stages(tmp_path, rtx):
    """SGLang's default config names neither (Triton's defaults run it): a pick of it is written with the values
    Triton launches it with, read from the installed Triton's own options, so the file says what runs; a config
    that states them is written as it is."""
    import dataclasses

    from triton.backends.nvidia.compiler import CUDAOptions

    launch = {f.name: f.default for f in dataclasses.fields(CUDAOptions) if f.name in ("num_warps", "num_stages")}
    default = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1}
    p = Problem(512, 128, 4096, 10, "bf16", batch_sizes=(1, 8))
    export_problem(_tuned(tmp_path, rtx), p, {1: _choice(1, default, dict(default)), 8: _choice(8, UP, UP)}, {})
    for down in (False, True):
        doc = json.loads((_tuned(tmp_path, rtx).config_dir() / sglang_file_name(p, rtx, down=down)).read_text())
        assert doc["1"] == {**default, **launch} and list(doc["1"]) == list(UP)       # the files' key order
        assert doc["8"] == UP
        assert all({"num_warps", "num_stages"} <= set(entry) for entry in doc.values())
