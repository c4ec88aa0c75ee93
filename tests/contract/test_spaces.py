import pytest

from autotune.contract import spaces
from autotune.cli import main
from autotune.gpus.device import planned
from autotune.families.triton_moe import TritonMoe, smem_estimate
from autotune.problems.models import Problem


def test_unknown_key_in_space_file_is_rejected(tmp_path, capsys):
    f = tmp_path / "s.yaml"
    f.write_text("family: triton_moe\nparams: {BLOCK_SIZE_M: [16]}\nmystery: 1\n")
    with pytest.raises(spaces.SpaceError, match="unknown key"):
        spaces.load("triton_moe", f)
    assert main(["shapes", "--model", "qwen3.5-35b-a3b", "--tp", "8", "--search-space", str(f),
                 "--target-sm", "90"]) == 2
    assert "unknown key" in capsys.readouterr().err


def test_arch_section_replaces_ladders():
    fam = TritonMoe()
    p = Problem(512, 128, 4096, 10, "bf16")
    assert 256 in fam.space(p, "gate_up", planned(90)).params["BLOCK_SIZE_M"]
    assert 256 not in fam.space(p, "gate_up", planned(120)).params["BLOCK_SIZE_M"]


def test_tma_only_where_sglang_kernel_implements_it():
    fam = TritonMoe()
    bf16, fp8b = Problem(512, 128, 4096, 10, "bf16"), Problem(512, 128, 4096, 10, "fp8_w8a8_block")
    h200 = planned(90)
    assert "USE_TMA" in fam.space(bf16, "gate_up", h200).params      # B (weights) by TMA: any dtype
    assert "USE_TMA" not in fam.space(bf16, "down", h200).params     # A by TMA: block FP8 only
    assert "USE_TMA" in fam.space(fp8b, "down", h200).params
    cfg = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1, "num_warps": 4,
           "num_stages": 2, "USE_TMA": True}
    assert "block-FP8" in fam.check(cfg, bf16, "down", h200)


def test_block_fp8_k_tile_must_divide_quant_block():
    fam = TritonMoe()
    p = Problem(512, 128, 4096, 10, "fp8_w8a8_block")
    cfg = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 256, "GROUP_SIZE_M": 1, "num_warps": 4, "num_stages": 2}
    assert "BLOCK_SIZE_K" in fam.check(cfg, p, "gate_up", planned(90))
    assert fam.check({**cfg, "BLOCK_SIZE_K": 128}, p, "gate_up", planned(90)) is None


def test_smem_estimate_splits_the_h200_grid_exactly_like_triton(grid_cache, h200):
    """Every config Triton refused for shared memory on the H200 is rejected before compile,
    and no config that ran is."""
    p = Problem.from_dict(next(iter(grid_cache.problems.values())))
    wrong = []
    for m in grid_cache.records.values():
        if "num_stages" not in m.config or m.status not in ("ok", "out_of_resources"):
            continue
        over = smem_estimate(m.config, p, h200) > h200.smem_optin
        if over != (m.status == "out_of_resources"):
            wrong.append((m.status, m.config))
    assert not wrong, wrong[:5]


def test_sm120_limit_rejects_configs_sm90_admits():
    fam = TritonMoe()
    p = Problem(512, 128, 4096, 10, "bf16")
    # 4 stages of 64x128 + 128x128 bf16 tiles: 196 KB on SM90 (fits 227 KB), 147 KB on SM120 (> 99 KB)
    cfg = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4, "num_stages": 4}
    assert fam.check(cfg, p, "gate_up", planned(90)) is None
    assert "shared memory" in fam.check(cfg, p, "gate_up", planned(120))


@pytest.mark.parametrize("param,value,says", [
    ("BLOCK_SIZE_K", 48, "BLOCK_SIZE_K must hold powers of two, got 48 (a tl.arange range and tl.dot's K)"),
    ("BLOCK_SIZE_K", 8, "BLOCK_SIZE_K must hold powers of two from 16 to 1048576, got 8"),
    ("BLOCK_SIZE_M", 24, "BLOCK_SIZE_M must hold powers of two, got 24 (a tl.arange range)"),
    ("BLOCK_SIZE_N", 1 << 21, "BLOCK_SIZE_N must hold powers of two from 1 to 1048576, got 2097152"),
    ("num_warps", 3, "num_warps must hold powers of two, got 3 (Triton's warps per program)"),
    ("num_warps", 64, "num_warps must hold powers of two from 1 to 32, got 64"),
    ("GROUP_SIZE_M", 0, "GROUP_SIZE_M must hold positive integers, got 0"),
    ("num_stages", True, "num_stages must hold positive integers, got True"),
    ("USE_TMA", 1, "USE_TMA must hold true/false, got 1"),
])
def test_a_space_value_the_kernel_does_not_take_is_refused_by_the_family(tmp_path, param, value, says):
    """A value Triton never compiles made every candidate fail, and SGLang's own config was written
    as the winner: the family's rules (TritonMoe.PARAMS) refuse it where the space is read."""
    import yaml

    doc = yaml.safe_load((spaces.SPACES_DIR / "triton_moe.yaml").read_text())
    (doc["gemm_params"]["gate_up"] if param == "USE_TMA" else doc["params"])[param] = [value]
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(spaces.SpaceError) as e:
        TritonMoe(str(tmp_path / "s.yaml")).space(Problem(512, 128, 4096, 10, "bf16"), "gate_up", planned(90))
    assert says in str(e.value)


def test_an_8_bit_dot_needs_k_of_32():
    fam, h200 = TritonMoe(), planned(90)
    cfg = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 16, "GROUP_SIZE_M": 1, "num_warps": 4,
           "num_stages": 2}
    assert "least K of Triton's 8-bit tl.dot" in fam.check(cfg, Problem(512, 128, 4096, 10, "fp8_w8a8"), "gate_up", h200)
    assert fam.check(cfg, Problem(512, 128, 4096, 10, "bf16"), "gate_up", h200) is None
