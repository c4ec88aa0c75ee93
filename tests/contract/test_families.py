"""Each kernel family is declared once, by its own class, and found where it is declared
(autotune/contract/registry.py): a new one is one package, installed beside autotune, that names itself in
the entry-point group autotune.families. The toy backend family of tests/fakes/toy_gemm/ and the toy config
family of tests/fakes/toy_moe_configs/ are each plugged in so (a distribution's metadata on sys.path, as pip
installs one), measured on this CPU by the measuring code a worker runs, and their recordings replayed by
`autotune run --kernels <toy>`, end to end, with nothing else of autotune/ told about them."""
import json

import pytest

from autotune.contract.config import KernelConfig
from autotune.contract import capabilities, registry
from autotune.cli import main
from autotune.gpus.device import cpu_interpreter
from autotune.contract.protocol import get_family
from autotune.measure.timing import noise
from autotune.measure.records import Cache, write_cache

SCOPE = ["--model", "qwen3.5-35b-a3b", "--tp", "8", "--batch-sizes", "1,8"]


def plug_in(monkeypatch, site, **packages):
    """A distribution whose entry points name `packages` (entry-point name -> package) in the group
    autotune.families, put on sys.path: what `pip install` of a plugin leaves."""
    dist = site / "autotune_toy_plugin-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: autotune-toy-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[autotune.families]\n" + "".join(f"{n} = {p}\n" for n, p in packages.items()))
    monkeypatch.syspath_prepend(str(site))


def record_on_this_cpu(path):
    """The toy family's every backend at every M of its problems, measured in this process by
    autotune.measure.measurer (check against the reference, then time; a careful pass too, as selection
    re-measures), written as a recording of this CPU."""
    from autotune.problems import models
    from autotune.measure.measurer import Measurer
    from autotune.measure.tasks import Settings, Task

    measurer = Measurer(Settings(family="toy_gemm", on_cpu=True, routings=1, repeats=3), None)
    (model,) = models.select_models(model="qwen3.5-35b-a3b")
    problems = {p.key: p for p in models.dense_gemms(model, 8, registry.get("toy_gemm").dtype, (1, 8))}
    cache = Cache(cpu_interpreter().to_dict())
    for p in problems.values():
        cache.problems[p.key] = p.to_dict()
        for b in (r.name for r in capabilities.runners("toy_gemm")):
            for M in p.batch_sizes:
                for careful in (False, True):
                    task = Task(p.to_dict(), p.key, "layer", KernelConfig.from_entry({"backend": b, "tactic": -1}), [M], family="toy_gemm",
                                repeats=21 if careful else None)
                    cache.add(measurer.measure(task, p, M)[0], careful=careful)
    write_cache(path, cache)
    return cache, problems


def test_a_toy_family_is_one_package_plugged_in_and_runs_in_replay(tmp_path, capsys, monkeypatch):
    assert "toy_gemm" not in registry.names()
    with monkeypatch.context() as plugged:
        plug_in(plugged, tmp_path / "site", toy_gemm="tests.fakes.toy_gemm")
        assert registry.names()[-1] == "toy_gemm" and [r.name for r in capabilities.runners("toy_gemm")] == \
            ["chunked", "doubled", "plain"]        # its package's modules, found by the capability table
        cache, problems = record_on_this_cpu(tmp_path / "toy.jsonl.gz")
        capsys.readouterr()
        rc = main(["run", "--kernels", "toy_gemm", "--replay", str(tmp_path / "toy.jsonl.gz"), *SCOPE,
                   "--out", str(tmp_path / "out"), "--storage", f"sqlite:///{tmp_path / 'a.db'}", "--quiet"])
        out = capsys.readouterr().out
    assert rc == 0, out
    assert "toy_gemm" not in registry.names()        # unplugged again
    # The recording decides: the correct backend with the least layer-weighted time over the decode mix.
    totals = {b: sum(p.layers * cache.get(k, "layer", M, KernelConfig.from_entry({"backend": b, "tactic": -1}), careful=True).time_us
                     for k, p in problems.items() for M in p.batch_sizes) for b in ("plain", "chunked")}
    # SGLang's auto (the toy's: plain) stays unless beaten beyond the noise of both sides' timings
    spread = {b: max(cache.get(k, "layer", M, KernelConfig.from_entry({"backend": b, "tactic": -1}), careful=True).spread
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
    """Each family's declaration is its own class's, found in its package: the kernel object's name, the
    runners' family and package, the MoE families' dtype, the flags SGLang is asked about; the run's order
    puts the config search first (the MoE runners run with the configs it wrote)."""
    from sglang.srt.arg_groups import choices

    assert registry.names() == ("triton_moe", "moe_bf16", "moe_fp8", "moe_fp4", "fp8_gemm", "fp4_gemm")
    assert registry.default() == "triton_moe" and registry.names(registry.CONFIGS) == ("triton_moe",)
    for name, spec in registry.families().items():
        fam = get_family(name)
        assert fam.name == name and type(fam) is spec.cls
        if spec.step == registry.BACKENDS:
            assert {r.family for r in capabilities.runners(name)} == {name}
            assert spec.runners == type(fam).__module__            # the package that declares it
            offered = getattr(choices, spec.sglang_choices)
            assert all(r.sglang_value in offered for r in capabilities.runners(name) if r.sglang_value), name
        if spec.problems == registry.MOE and spec.dtype:
            assert fam.dtype == spec.dtype
    assert registry.with_flag("moe-runner-backend") == ("moe_bf16", "moe_fp8", "moe_fp4")


@pytest.mark.parametrize("package, says", [
    ("autotune.families.fp8_gemm", "declares kernel family 'fp8_gemm', which autotune.families.fp8_gemm declares "
                                   "already"),
    ("tests.no_such_family", "does not load: ModuleNotFoundError"),
    ("tests.fakes.toy_gemm.plain", "declares no kernel family"),
])
def test_a_plugin_that_declares_no_family_or_a_taken_name_is_one_line(tmp_path, capsys, monkeypatch, package, says):
    """Bad input from an installed plugin: the command says which entry point and why, and exits 2."""
    plug_in(monkeypatch, tmp_path / "site", broken=package)
    with pytest.raises(registry.FamilyError, match=says):
        registry.names()
    assert main(["run", "--kernels", "triton_moe", "--dry-run", *SCOPE]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("autotune: error: ") and "autotune.families entry point" in err


def record_configs_on_this_cpu(path):
    """The toy config family's every config of both GEMMs at every M of its one problem, measured in
    this process by autotune.measure.measurer (search-time and careful), written as a recording of this CPU."""
    from autotune.problems import models
    from autotune.measure.measurer import Measurer
    from autotune.measure.tasks import Settings, Task
    from tests.fakes.toy_moe_configs import GEMMS, SPACE
    from autotune.contract.spaces import Space

    measurer = Measurer(Settings(family="toy_moe", on_cpu=True, routings=1, repeats=3), None)
    (model,) = models.select_models(model="qwen3.5-35b-a3b")
    (p,) = models.expand([model], (8,), (1,), ("bf16",), (1, 8)).problems
    cache = Cache(cpu_interpreter().to_dict())
    cache.problems[p.key] = p.to_dict()
    for gemm in GEMMS:
        for cfg in Space("toy_moe", SPACE).configs():
            for M in p.batch_sizes:
                for careful in (False, True):
                    task = Task(p.to_dict(), p.key, gemm, cfg, [M], family="toy_moe", repeats=5 if careful else None)
                    m = measurer.measure(task, p, M)[0]
                    assert m.ok, m.reason
                    cache.add(m, careful=careful)
    write_cache(path, cache)
    return cache, p


def test_a_toy_config_family_is_one_package_plugged_in_and_runs_in_replay(tmp_path, capsys, monkeypatch):
    from autotune.contract.spaces import Space
    from tests.fakes.toy_moe_configs import DEFAULT, SPACE

    with monkeypatch.context() as plugged:
        plug_in(plugged, tmp_path / "site", toy_moe="tests.fakes.toy_moe_configs")
        assert registry.names(registry.CONFIGS) == ("triton_moe", "toy_moe")
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
        return cache.get(p.key, gemm, M, KernelConfig.from_entry(cfg), careful=True).time_us
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


def test_only_the_fused_moe_family_names_its_keys_and_its_name():
    """The search, the measuring, the store and the pipeline take a config family's rules from its hooks
    (coupled parameter, key order, selection, export) and the family to work on from the registry: outside
    the Triton fused-MoE family's package, no module (comments included) names its tile key or the family."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "autotune"
    package = root / "families" / "triton_moe"
    named = [f"{path.relative_to(root)}:{n}" for path in sorted(root.rglob("*.py")) if package not in path.parents
             for n, line in enumerate(path.read_text().splitlines(), 1) if "BLOCK_SIZE_M" in line or '"triton_moe"' in line]
    assert len(list(package.glob("*.py"))) > 3 and named == []


def required_hooks(protocol) -> set[str]:
    """The names a family must have to answer `protocol` (autotune.contract.protocol): its annotated attributes
    and its methods, less those the protocol marks optional (the core asks for them with getattr)."""
    import inspect
    from typing import Protocol

    names = set()
    for cls in protocol.__mro__:
        if cls in (Protocol, object) or Protocol not in cls.__mro__:
            continue
        names |= set(getattr(cls, "__annotations__", {}))
        names |= {n for n, f in vars(cls).items() if inspect.isfunction(f) and not n.startswith("_")
                  and not (f.__doc__ or "").startswith("Optional")}
    return names


@pytest.mark.parametrize("name", registry.names())
def test_every_family_in_the_tree_answers_its_protocol(name):
    """The core calls a family only through the hooks of its protocol: each family has every one of them."""
    from autotune.contract.protocol import BackendChoiceFamily, ConfigFamily

    family = get_family(name)
    protocol = ConfigFamily if registry.get(name).step == registry.CONFIGS else BackendChoiceFamily
    assert {"select", "confirm", "export", "flag", "runner"} & required_hooks(protocol)    # read from the protocol
    assert sorted(h for h in required_hooks(protocol) if not hasattr(family, h)) == []
