"""Files for the SGLang release that serves them, checked with each release's own code.

The checks run tests/adapters/sglang_release_probe.py in a fresh process per release (one for all committed
folders and dtypes): that release's loader reads each folder and its `_prepare_fused_moe_run` turns
each entry into the keyword arguments its Triton kernel gets; a key outside the kernel's real
signature is what crashed SGLang 0.5.16's server on the H200 (`USE_TMA` in the up file). 0.5.16's
tree comes from scripts/setup.sh; 0.5.23 is installed.
"""
import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.adapters import sglang_versions as sv
from autotune.cli import main
from autotune.measure.records import read_cache

ROOT = Path(__file__).resolve().parents[2]
RELEASES = {"0.5.16": str(ROOT / ".venv/sglang-releases/0.5.16"), "0.5.23": "installed"}
PROBLEMS = {"bf16": "E=512,N=128,device_name=NVIDIA_H200.json",
            "fp8_w8a8_block": "E=512,N=128,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json"}
RUN_RECORD = ROOT / "benchmarks/data/h200_run_bf16_2026-12-01.jsonl.gz"


def find(folder: Path, name: str) -> Path:
    """configs/triton_*/<name> (SGLang's names hold glob brackets: `[128, 128]`)."""
    return next(p for p in (folder / "configs").glob("*/*") if p.name == name)


FOLDERS = ["tuned_configs/NVIDIA_H200", "tuned_configs/sglang-0.5.16/NVIDIA_H200"]


def probe_all(release: str, jobs: list[tuple[Path, str]]) -> list[dict]:
    """One fresh process per release checks every (folder, dtype): importing the release is most of it."""
    root = RELEASES[release]
    if root != "installed" and not Path(root, "sglang/__init__.py").exists():
        pytest.fail(f"SGLang {release}'s source is missing from {root}: run scripts/setup.sh")
    out = subprocess.run([sys.executable, str(ROOT / "tests/adapters/sglang_release_probe.py"), root, "NVIDIA_H200", "512",
                          "128", "4096", "10", *(f"{folder}:{dtype}" for folder, dtype in jobs)],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    return [json.loads(line) for line in out.stdout.strip().splitlines()[-len(jobs):]]


@functools.cache
def committed(release: str) -> dict:
    """(folder, dtype) -> the probe's answer for every committed folder and dtype, one process per release."""
    jobs = [(f, d) for f in FOLDERS for d in sorted(PROBLEMS)]
    return dict(zip(jobs, probe_all(release, [(ROOT / f, d) for f, d in jobs])))


def probe(release: str, folder: Path, dtype: str) -> dict:
    return probe_all(release, [(folder, dtype)])[0]


@pytest.mark.slow
@pytest.mark.parametrize("release", sorted(RELEASES))
@pytest.mark.parametrize("folder", FOLDERS)
@pytest.mark.parametrize("dtype", sorted(PROBLEMS))
def test_committed_files_run_exactly_in_the_releases_their_provenance_names(release, folder, dtype):
    got = committed(release)[folder, dtype]
    assert (release == "0.5.23") == (got["sglang_file"].find(".venv/sglang-releases") < 0)
    # Loaded from our folder (the loader's own log lines), every entry of the file.
    assert got["loaded"] and all(f"{folder}/configs/" in msg for msg in got["loaded"])
    up = json.loads(find(ROOT / folder, PROBLEMS[dtype]).read_text())
    assert sorted(got["per_M"], key=int) == sorted(up, key=int)
    runs = not any(v["rejected"] for v in got["per_M"].values())
    prov = json.loads((ROOT / folder / "provenance.json").read_text())["files"][PROBLEMS[dtype]]
    assert runs == (release in prov["sglang_versions"]), (release, prov["sglang_versions"], got["per_M"])


@pytest.mark.slow
def test_the_version_table_agrees_with_each_releases_code(tmp_path):
    """A file with USE_TMA in the up and the down file: each release's code must reject or accept it
    exactly as the table says (a wrong table entry fails here, not in a user's server)."""
    folder = tmp_path / "NVIDIA_H200"
    dst = folder / "configs/triton_3_6_0"
    dst.mkdir(parents=True)
    up = {"1": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4,
                "num_stages": 3, "USE_TMA": True}}
    for name in (PROBLEMS["bf16"], PROBLEMS["bf16"].replace(".json", "_down.json")):
        (dst / name).write_text(json.dumps(up))
    rejected = {}
    for release in RELEASES:
        got = probe(release, folder, "bf16")["per_M"]["1"]
        rejected[release] = "USE_TMA" in got["rejected"]
        assert rejected[release] == (not sv.RELEASES[release].up_tma), (release, got)
    # both answers occur: 0.5.16's kernel has no USE_TMA parameter (its server crashed on the H200), 0.5.23's has
    assert rejected == {"0.5.16": True, "0.5.23": False}


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    """The recorded H200 bf16 run, searched again and exported for SGLang 0.5.16."""
    tmp = tmp_path_factory.mktemp("targets")
    base = ["run", "--model", "qwen3.5-397b-a17b", "--tp", "8", "--dtype", "bf16", "--kernels", "triton_moe",
            "--replay", str(RUN_RECORD), "--batch-sizes", "8,64,512", "--trials", "12", "--quiet"]
    for name, extra in (("old", ["--sglang-version", "0.5.16"]),):
        assert main(base + ["--out", str(tmp / name), "--storage", f"sqlite:///{tmp / name}.db", *extra]) == 0
    return tmp


@pytest.mark.slow
def test_export_for_an_older_release_drops_up_tma_by_choosing_again(replayed):
    folder = replayed / "old/NVIDIA_H200"
    up = json.loads(find(folder, PROBLEMS["bf16"]).read_text())
    assert not any(c.get("USE_TMA") for c in up.values())
    prov = json.loads((folder / "provenance.json").read_text())["files"][PROBLEMS["bf16"]]
    assert prov["sglang_targets"] == ["0.5.16"] and "0.5.16" in prov["sglang_versions"]
    got = probe("0.5.16", folder, "bf16")
    assert not any(v["rejected"] for v in got["per_M"].values())
    # Chosen again among measured configs without TMA: every written up config is one the H200
    # recording measured at that M, at the time provenance gives it (not the TMA winner with the key dropped).
    # (a written entry states num_warps and num_stages: a config measured without them, SGLang's default, is the
    # one whose launch values they are)
    from autotune.families.triton_moe.schema import entry_config

    record = read_cache(RUN_RECORD)
    key = "E=512,N=128,K=4096,topk=10,bf16"
    for M, c in up.items():
        m = next((m for m in record.records.values() if (m.problem, m.gemm, m.M) == (key, "gate_up", int(M))
                  and entry_config(m.config).to_entry() == c), None)
        assert m is not None and m.ok and round(m.time_us, 3) == prov["per_M"][M]["gate_up_us"]


def test_bad_sglang_version_is_one_line_and_writes_nothing(tmp_path, capsys):
    for bad, says in (("0.5.15", "not a supported release"), ("0.5.23-0.5.16", "is empty"),
                      ("0.5.16,", "empty entry"), ("latest", "not a supported release")):
        out = tmp_path / "out"
        rc = main(["run", "--model", "qwen3.5-397b-a17b", "--tp", "8", "--dtype", "bf16", "--kernels", "triton_moe",
                   "--replay", str(RUN_RECORD), "--batch-sizes", "8", "--sglang-version", bad,
                   "--out", str(out), "--storage", f"sqlite:///{tmp_path / 'x.db'}", "--quiet"])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and says in err[0], (bad, err)
        assert not list(out.rglob("*.json"))


def test_version_lists_and_ranges():
    assert sv.parse_targets("0.5.16") == ("0.5.16",)
    assert sv.parse_targets("0.5.17..0.5.19") == ("0.5.17", "0.5.18", "0.5.19")
    assert sv.parse_targets("0.5.23, 0.5.16-0.5.17") == ("0.5.16", "0.5.17", "0.5.23")
    assert sv.parse_targets("0.5.16.post1") == ("0.5.16",)
    assert sv.valid_releases({"1": {"USE_TMA": True}}, {}) == [v for v in sv.SUPPORTED if sv.RELEASES[v].up_tma]
    assert sv.valid_releases({}, {"1": {"USE_TMA": True}}, tma_capable=False) == \
        [v for v in sv.SUPPORTED if not sv.RELEASES[v].down_tma_needs_descriptors]


def test_only_releases_without_up_tma_take_it_out_of_the_gate_up_space():
    from autotune.gpus.device import DeviceInfo
    from autotune.families.triton_moe import TritonMoe
    from autotune.problems.models import Problem

    h200 = DeviceInfo.from_dict(read_cache(RUN_RECORD).device)
    p = Problem(512, 128, 4096, 10, "fp8_w8a8_block", (8,))
    for targets, up_tma in ((("0.5.23",), True), (("0.5.18", "0.5.23"), True), (("0.5.16", "0.5.23"), False)):
        fam = TritonMoe(sglang_versions=targets)
        assert ("USE_TMA" in fam.space(p, "gate_up", h200).params) == up_tma
        assert "USE_TMA" in fam.space(p, "down", h200).params      # every release pops the down key on SM90
        cfg = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4,
               "num_stages": 3, "USE_TMA": True}
        assert (fam.check(cfg, p, "gate_up", h200) is None) == up_tma
        assert (fam.unwritable(cfg, "gate_up", h200) is None) == up_tma


def test_check_at_the_door(tmp_path, capsys):
    h200, old = str(ROOT / "tuned_configs/NVIDIA_H200"), str(ROOT / "tuned_configs/sglang-0.5.16/NVIDIA_H200")
    assert main(["check", h200, "--sglang-version", "0.5.23"]) == 0
    assert main(["check", h200, "--sglang-version", "0.5.16"]) == 1
    assert "re-export with --sglang-version 0.5.16" in capsys.readouterr().out
    assert main(["check", old, "--sglang-version", "0.5.16-0.5.23"]) == 0
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    prov = json.loads((ROOT / "tuned_configs/NVIDIA_H200/provenance.json").read_text())
    for e in prov["files"].values():
        e.pop("sglang_versions")
    (legacy / "provenance.json").write_text(json.dumps(prov))
    capsys.readouterr()
    for argv, says in (([str(tmp_path)], "no provenance.json"), ([str(legacy)], "records no SGLang versions"),
                       ([h200, "--sglang-version", "0.4.0"], "not a supported release"),
                       ([str(tmp_path / "none")], "is not a folder")):
        assert main(["check", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and says in err[0], (argv, err)
