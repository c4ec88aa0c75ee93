"""Each kernel family is declared once (autotune/families/registry.py), and a new one is one package plus one
registry entry: the toy backend family of tests/toy_gemm/ is measured on this CPU by the measuring
code a worker runs, and its recording replayed by `autotune run --kernels toy_gemm`, end to end,
with nothing else of autotune/ told about it."""
import json

import pytest

from autotune.families import capabilities, registry
from autotune.cli import main
from autotune.gpus.device import cpu_interpreter
from autotune.families.protocol import get_family
from autotune.measure.timing import noise
from autotune.measure.records import Cache, write_cache

TOY = registry.Family("toy_gemm", "tests.toy_gemm:ToyGemm", registry.BACKENDS, registry.DENSE, "fp8_w8a8_block",
                      "fp8-gemm-backend", "FP8_GEMM_RUNNER_BACKEND_CHOICES", "tests.toy_gemm", ("skip",))
SCOPE = ["--model", "qwen3.5-35b-a3b", "--tp", "8", "--batch-sizes", "1,8"]


def record_on_this_cpu(path):
    """The toy family's every backend at every M of its problems, measured in this process by
    autotune.measure.measurer (check against the reference, then time; a careful pass too, as selection
    re-measures), written as a recording of this CPU."""
    from autotune.problems import models
    from autotune.measure.measurer import Measurer
    from autotune.measure.tasks import Settings, Task

    fam = get_family("toy_gemm")
    measurer = Measurer(Settings(family=fam.spec, on_cpu=True, routings=1, repeats=3), None)
    (model,) = models.select_models(model="qwen3.5-35b-a3b")
    problems = {p.key: p for p in models.dense_gemms(model, 8, TOY.dtype, (1, 8))}
    cache = Cache(cpu_interpreter().to_dict())
    for p in problems.values():
        cache.problems[p.key] = p.to_dict()
        for b in (r.name for r in capabilities.runners("toy_gemm")):
            for M in p.batch_sizes:
                for careful in (False, True):
                    task = Task(p.to_dict(), p.key, "layer", {"backend": b, "tactic": -1}, [M], family=fam.spec,
                                repeats=21 if careful else None)
                    cache.add(measurer.measure(task, p, M)[0], careful=careful)
    write_cache(path, cache)
    return cache, problems


def test_a_toy_family_is_one_package_and_one_entry_and_runs_in_replay(tmp_path, capsys):
    with registry.plugged(TOY):
        assert "toy_gemm" in registry.names() and [r.name for r in capabilities.runners("toy_gemm")] == \
            ["chunked", "doubled", "plain"]        # its package's modules, found by the capability table
        cache, problems = record_on_this_cpu(tmp_path / "toy.jsonl.gz")
        capsys.readouterr()
        rc = main(["run", "--kernels", "toy_gemm", "--replay", str(tmp_path / "toy.jsonl.gz"), *SCOPE,
                   "--out", str(tmp_path / "out"), "--storage", f"sqlite:///{tmp_path / 'a.db'}", "--quiet"])
        out = capsys.readouterr().out
    assert rc == 0, out
    assert "toy_gemm" not in registry.names()        # unplugged again
    # The recording decides: the correct backend with the least layer-weighted time over the decode mix.
    totals = {b: sum(p.layers * cache.get(k, "layer", M, {"backend": b, "tactic": -1}, careful=True).time_us
                     for k, p in problems.items() for M in p.batch_sizes) for b in ("plain", "chunked")}
    # SGLang's auto (the toy's: plain) stays unless beaten beyond the noise of both sides' timings
    spread = {b: max(cache.get(k, "layer", M, {"backend": b, "tactic": -1}, careful=True).spread
                     for k, p in problems.items() for M in p.batch_sizes) for b in totals}
    beaten = totals["chunked"] * (1 + noise(*spread.values())) < totals["plain"]
    best = "chunked" if beaten else "plain"
    if totals["chunked"] < totals["plain"] and not beaten:
        assert "kept over chunked (faster by less than the noise)" in out
    value = {"plain": "triton", "chunked": "cutlass"}[best]
    folder = tmp_path / "out/CPU_Triton_interpreter"
    assert f"toy_gemm: one backend per server, decode mix: {best}" in out
    assert f"\nfp8-gemm-backend: {value}" in (folder / "server_args.yaml").read_text()
    choice = json.loads((folder / "backend_choice.json").read_text())["families"]["toy_gemm"]
    assert list(choice["server_choice"]["decode"]["disqualified"]) == ["doubled"]
    assert all({b: m["status"] for b, m in choice[k]["disqualified"].items()} == {"doubled": "wrong_result"}
               for k in problems)


def test_the_registry_is_where_the_pipeline_reads_each_family():
    """What used to be declared in several places derives from the one entry: the kernel object's
    name, the runners' family and package, the MoE families' dtype, the flags SGLang is asked about."""
    from sglang.srt.arg_groups import choices

    for name, spec in registry.REGISTRY.items():
        fam = get_family(name)
        assert fam.name == name
        if spec.step == registry.BACKENDS:
            assert {r.family for r in capabilities.runners(name)} == {name}
            offered = getattr(choices, spec.sglang_choices)
            assert all(r.sglang_value in offered for r in capabilities.runners(name) if r.sglang_value), name
        if spec.problems == registry.MOE and spec.dtype:
            assert fam.dtype == spec.dtype
    assert registry.with_flag("moe-runner-backend") == ("moe_bf16", "moe_fp8", "moe_fp4")
    with pytest.raises(ValueError, match="registered already"):
        with registry.plugged(registry.get("fp8_gemm")):
            pass


TOY_CONFIGS = registry.Family("toy_moe", "tests.toy_moe_configs:ToyMoeConfigs", registry.CONFIGS, registry.MOE,
                              "bf16", options=("sglang_versions",))


def record_configs_on_this_cpu(path):
    """The toy config family's every config of both GEMMs at every M of its one problem, measured in
    this process by autotune.measure.measurer (search-time and careful), written as a recording of this CPU."""
    from autotune.problems import models
    from autotune.measure.measurer import Measurer
    from autotune.measure.tasks import Settings, Task
    from tests.toy_moe_configs import GEMMS, SPACE
    from autotune.families.spaces import Space

    fam = get_family("toy_moe")
    measurer = Measurer(Settings(family=fam.spec, on_cpu=True, routings=1, repeats=3), None)
    (model,) = models.select_models(model="qwen3.5-35b-a3b")
    (p,) = models.expand([model], (8,), (1,), ("bf16",), (1, 8)).problems
    cache = Cache(cpu_interpreter().to_dict())
    cache.problems[p.key] = p.to_dict()
    for gemm in GEMMS:
        for cfg in Space("toy_moe", SPACE).configs():
            for M in p.batch_sizes:
                for careful in (False, True):
                    task = Task(p.to_dict(), p.key, gemm, cfg, [M], family=fam.spec, repeats=5 if careful else None)
                    m = measurer.measure(task, p, M)[0]
                    assert m.ok, m.reason
                    cache.add(m, careful=careful)
    write_cache(path, cache)
    return cache, p


def test_a_toy_config_family_is_one_package_and_one_entry_and_runs_in_replay(tmp_path, capsys):
    from autotune.families.spaces import Space
    from tests.toy_moe_configs import DEFAULT, SPACE

    with registry.plugged(TOY_CONFIGS):
        cache, p = record_configs_on_this_cpu(tmp_path / "toy.jsonl.gz")
        capsys.readouterr()
        rc = main(["run", "--kernels", "toy_moe", "--replay", str(tmp_path / "toy.jsonl.gz"), *SCOPE,
                   "--trials", "4", "--out", str(tmp_path / "out"), "--storage", f"sqlite:///{tmp_path / 'a.db'}",
                   "--json", str(tmp_path / "summary.json"), "--quiet"])
        out = capsys.readouterr().out
    assert rc == 0, out
    folder = tmp_path / "out/CPU_Triton_interpreter"
    (up_file,) = folder.glob("configs/triton_*/E=256,N=64,device_name=CPU_Triton_interpreter.json")
    up = json.loads(up_file.read_text())
    down = json.loads(up_file.with_name(up_file.stem + "_down.json").read_text())
    assert set(up) == set(down) == {"1", "8"}

    def careful_us(gemm, M, cfg):
        return cache.get(p.key, gemm, M, cfg, careful=True).time_us
    space = Space("toy_moe", SPACE)
    for M in ("1", "8"):
        assert space.indices_of(up[M]) is not None and space.indices_of(down[M]) is not None
        assert up[M]["BLOCK_SIZE_M"] == down[M]["BLOCK_SIZE_M"]      # one alignment for both GEMMs
        # the recording decides: wide K slices beat the toy's default of 16-wide ones, as measured
        tuned = careful_us("gate_up", int(M), up[M]) + careful_us("down", int(M), down[M])
        assert tuned <= careful_us("gate_up", int(M), DEFAULT) + careful_us("down", int(M), DEFAULT)
    (problem,) = json.loads((tmp_path / "summary.json").read_text())["toy_moe"]
    assert problem["problem"] == p.key and sorted(problem["files"]) == sorted(
        str(f) for f in (up_file, up_file.with_name(up_file.stem + "_down.json")))
