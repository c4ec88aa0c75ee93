"""Exact SM120 limits on a CPU: SGLang's fused-MoE call path compiled for sm_120 here, against the
committed record that filters the sm120 search space (search_spaces/compiled/sm120.json)."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from autotune.gpus.device import planned
from autotune.families.triton_moe.cross_compile import load, record_key
from autotune.families.triton_moe import TritonMoe, smem_estimate
from autotune.problems.models import Problem

ROOT = Path(__file__).resolve().parents[3]
SM120 = planned(120)
CFG = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4, "num_stages": 3}
SAMPLES = [("bf16", "gate_up", CFG), ("bf16", "gate_up", {**CFG, "USE_TMA": True}),
           ("bf16", "down", {**CFG, "BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "num_stages": 2}),
           ("fp8_w8a8_block", "down", {**CFG, "num_stages": 4}),
           ("fp8_w8a8_block", "gate_up", {**CFG, "BLOCK_SIZE_M": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 16})]


def compile_in_fresh_process(samples) -> list:
    """The tests run SGLang's kernels under TRITON_INTERPRET=1 (conftest), where Triton compiles
    nothing: compile in a child process without it."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = textwrap.dedent("""
        import json, sys
        from autotune.contract.config import KernelConfig
        from autotune.families.triton_moe.cross_compile import compile_one, cross_target
        from autotune.families.triton_moe import TritonMoe
        from autotune.problems.models import Problem
        fam, cache, out = TritonMoe(), {}, []
        with cross_target(120):
            for dtype, gemm, cfg in json.loads(sys.argv[1]):
                out.append(compile_one(fam, Problem(512, 128, 4096, 10, dtype, (64,)), gemm,
                                       KernelConfig.from_entry(cfg), cache))
        print(json.dumps(out))
    """)
    p = subprocess.run([sys.executable, "-c", code, json.dumps(samples)], capture_output=True, text=True,
                       env=env, cwd=ROOT, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_recompiling_a_sample_gives_the_recorded_shared_memory():
    rec = load(120)
    assert rec is not None and rec["triton"] == "3.8.0", "search_spaces/compiled/sm120.json (autotune compile-limits)"
    got = compile_in_fresh_process(SAMPLES + [("bf16", "gate_up", {**CFG, "GROUP_SIZE_M": 64})])
    for (dtype, gemm, cfg), g in zip(SAMPLES, got):
        assert g == rec["records"][record_key(dtype, gemm, cfg)], (dtype, gemm, cfg, g)
        assert g["shared"] > 0
    assert got[-1] == got[0], "GROUP_SIZE_M does not change what the kernel allocates"


def test_the_sm120_space_is_filtered_by_compiled_facts():
    rec = load(120)["records"]
    fam = TritonMoe()
    p = Problem(512, 128, 4096, 10, "bf16", (64,))
    # Where the estimate and the compiler disagree, check follows the compiler.
    disagree = []
    for c in fam.space(p, "gate_up", SM120).configs():
        r = rec.get(record_key("bf16", "gate_up", c))
        if r and "shared" in r and (r["shared"] > SM120.smem_optin) != (smem_estimate(c, p, SM120) > SM120.smem_optin):
            disagree.append((c, r["shared"]))
    for c, shared in disagree[:20]:
        why = fam.check(c, p, "gate_up", SM120)
        assert (why is not None) == (shared > SM120.smem_optin)
        if why:
            assert "compiled for sm120" in why
    ok = [c for c in fam.space(p, "gate_up", SM120).configs() if fam.check(c, p, "gate_up", SM120) is None]
    assert ok and all(rec[record_key("bf16", "gate_up", c)]["shared"] <= SM120.smem_optin for c in ok)


@pytest.mark.parametrize("sm", [90])
def test_architectures_without_a_record_keep_the_estimate(sm):
    assert load(sm) is None
    fam = TritonMoe()
    p = Problem(512, 128, 4096, 10, "bf16", (64,))
    big = {**CFG, "BLOCK_SIZE_M": 256, "BLOCK_SIZE_N": 256, "BLOCK_SIZE_K": 256, "num_stages": 5}
    assert "estimate" in fam.check(big, p, "gate_up", planned(sm))


def test_check_follows_the_record_not_the_estimate(monkeypatch):
    """The record decides for the configs it holds: a compile failure or an over-limit kernel is
    rejected with the compiler's word even where the estimate would admit it."""
    import autotune.families.triton_moe.cross_compile as cc

    fam = TritonMoe()
    p = Problem(512, 128, 4096, 10, "bf16", (64,))
    small = {**CFG, "BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "num_stages": 2}
    assert smem_estimate(small, p, SM120) <= SM120.smem_optin and fam.check(small, p, "gate_up", SM120) is None
    fake = {"triton": "3.8.0", "records": {record_key("bf16", "gate_up", small): {"shared": 200000},
                                           record_key("bf16", "down", small): {"error": "PassManager::run failed"}}}
    monkeypatch.setattr(cc, "load", lambda sm, triton_version=None: fake if sm == 120 else None)
    assert "compiled for sm120 (Triton 3.8.0): needs 200000 B" in fam.check(small, p, "gate_up", SM120)
    assert "does not compile for sm120" in fam.check(small, p, "down", SM120)
