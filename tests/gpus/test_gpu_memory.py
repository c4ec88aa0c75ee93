"""GPU memory as a planned resource: the pool sized from a GPU's memory and the machine's cores, each
process's share, the footprints families predict, and the plan said before anything runs."""
import pytest
from hypothesis import given, settings, strategies as st

from autotune.gpus import memory_plan as gm
from autotune.cli import main
from autotune.gpus.device import planned_gpu
from autotune.gpus.catalog import CATALOG, GiB
from autotune.problems.models import Problem

QWEN397_TP8 = Problem(512, 128, 4096, 10, "bf16")


def _fp(gib_, what="w"):
    return gm.Footprint(what, {"x": int(gib_ * GiB) - gm.CONTEXT_BYTES})


def _h100(free=80, cap=None, index=0):
    return gm.GpuMemory(index, 80 * GiB, int(free * GiB), cap)


def test_an_80gb_gpu_holds_what_its_memory_fits_not_what_its_cores_allow():
    # the H100 crash: 15 workers of ~5.2 GiB and the run's own layer check filled 80 GB
    plan = gm.plan_pool([_h100()], [gm.Phase("Triton configs", _fp(5.2), _fp(4.2))], cores=16, requested=None)
    ph = plan.phases[0]
    n = plan.workers[ph.name][0]
    assert n == (80 * GiB - 4 * GiB - int(4.2 * GiB)) // int(5.2 * GiB) == 13
    assert plan.limited_by[ph.name] == "memory"
    # every process's share together with the margin fits the GPU
    assert n * plan.share(0, ph, n) + ph.main.total + _h100().margin <= 80 * GiB


def test_cores_limit_a_gpu_with_room_and_a_cap_plans_for_a_smaller_card():
    phase = [gm.Phase("p", _fp(5.2), _fp(4.2))]
    assert gm.plan_pool([_h100()], phase, cores=4, requested=None).workers["p"] == (3,)
    capped = gm.plan_pool([_h100(cap=32 * GiB)], phase, cores=16, requested=None)
    assert capped.workers["p"] == ((32 * GiB - int(1.6 * GiB) - int(4.2 * GiB)) // int(5.2 * GiB),)
    assert capped.gpus[0].usable == 32 * GiB


def test_a_phase_that_compiles_apart_measures_with_one_process_a_gpu_and_builds_on_the_other_cores():
    """Builders hold no CUDA context: the GPU keeps one measuring process, which gets the whole budget, and every
    core but the run's and the measuring processes' compiles; --workers and --builders are taken as given."""
    apart = gm.Phase("Triton configs", _fp(5.2), _fp(4.2), apart=True)
    plan = gm.plan_pool([_h100(index=0), _h100(index=1)], [apart, gm.Phase("backend choice", _fp(5.2))],
                        cores=16, requested=None)
    assert plan.workers["Triton configs"] == (1, 1) and plan.builders == 16 - 1 - 2
    assert plan.workers["backend choice"] == (8, 7)          # compiles in its workers: cores - 1
    assert plan.limits(apart)[0] == plan.budget(0, apart) - gm.CONTEXT_BYTES
    assert gm.plan_pool([_h100()], [apart], cores=16, requested=2, builders=5).workers["Triton configs"] == (2,)
    assert gm.plan_pool([_h100()], [apart], cores=16, requested=2, builders=5).builders == 5
    assert gm.plan_pool([_h100()], [gm.Phase("p", _fp(5.2))], cores=16, requested=None).builders == 0



def test_a_cap_above_the_free_memory_plans_for_what_is_free():
    """AUTOTUNE_GPU_MEMORY stands for a smaller card, never for memory another process holds: 32 GiB
    capped on an 80 GiB card of which 20 GiB are free plans for the 20."""
    phase = [gm.Phase("p", _fp(2), _fp(4))]
    busy = _h100(free=20, cap=32 * GiB)
    assert busy.usable == 20 * GiB
    plan = gm.plan_pool([busy], phase, cores=64, requested=None)
    assert plan.workers["p"] == ((20 * GiB - busy.margin - 4 * GiB) // (2 * GiB),)
    ph = plan.phases[0]
    assert plan.workers["p"][0] * plan.share(0, ph, plan.workers["p"][0]) + ph.main.total + busy.margin <= 20 * GiB


@pytest.mark.parametrize("free, cap", [(80, None), (80, 32 * GiB), (30, None)])
def test_every_workers_limit_and_its_cuda_context_together_fit_its_gpu(free, cap):
    """limits() is what torch's allocator may hold in each worker; the CUDA context is held outside it, so
    the limits and the contexts of all workers, the run's own need and the margin fit the GPU's memory
    (without the context counted, 15 workers' limits came to 91 GiB on an 80 GiB card)."""
    gpus = [_h100(free=free, cap=cap), _h100(free=free, cap=cap, index=1)]
    phases = [gm.Phase("configs", _fp(1.5), _fp(4)), gm.Phase("backends", _fp(3))]
    plan = gm.plan_pool(gpus, phases, cores=128, requested=None)
    for ph in phases:
        limits = plan.limits(ph)
        for i, g in enumerate(gpus):
            n = plan.workers[ph.name][i]
            main = ph.main.total if ph.main is not None and i == 0 else 0
            assert limits[g.index] >= ph.per_worker.total - gm.CONTEXT_BYTES     # room for its tensors
            assert n * (limits[g.index] + gm.CONTEXT_BYTES) + main + g.margin <= g.usable

def test_a_workers_flag_that_does_not_fit_is_lowered_and_said():
    plan = gm.plan_pool([_h100()], [gm.Phase("p", _fp(5.2), _fp(4.2))], cores=64, requested=15)
    assert plan.workers["p"] == (13,) and plan.lowered_from == 15
    assert any("--workers 15 does not fit the GPU memory: lowered to 13" in line for line in plan.lines("NVIDIA H100"))
    kept = gm.plan_pool([_h100()], [gm.Phase("p", _fp(5.2), _fp(4.2))], cores=64, requested=6)
    assert kept.workers["p"] == (6,) and kept.lowered_from is None


def test_each_phase_gets_the_workers_it_fits_and_the_run_process_only_the_first_gpu():
    phases = [gm.Phase("Triton configs", _fp(5), _fp(10)), gm.Phase("backend choice", _fp(20))]
    plan = gm.plan_pool([_h100(index=2), _h100(index=5)], phases, cores=128, requested=None)
    assert plan.workers["Triton configs"] == (13, 15)     # (80 - 4 - 10) // 5 on the first; (80 - 4) // 5, at most 15
    assert plan.workers["backend choice"] == (3, 3)
    assert plan.slots(phases[0])[:4] == [2, 5, 2, 5]


def test_a_problem_no_worker_can_hold_is_refused_with_its_numbers():
    with pytest.raises(gm.DoesNotFit, match=r"one worker needs 40.0 GiB .* 30.4 GiB is free on GPU 0 \(after the margin\)"):
        gm.plan_pool([gm.GpuMemory(0, 32 * GiB, 32 * GiB)], [gm.Phase("p", _fp(40))], cores=8, requested=None)


@settings(max_examples=300, deadline=None)
@given(gpus=st.lists(st.integers(8, 200), min_size=1, max_size=4), cap=st.one_of(st.none(), st.integers(4, 200)),
       phases=st.lists(st.tuples(st.floats(0.9, 60), st.one_of(st.none(), st.floats(0.9, 30))), min_size=1, max_size=3),
       cores=st.one_of(st.none(), st.integers(1, 256)), requested=st.one_of(st.none(), st.integers(1, 60)))
def test_property_a_plan_never_gives_out_more_memory_than_a_gpu_has(gpus, cap, phases, cores, requested):
    mems = [gm.GpuMemory(i, g * GiB, g * GiB, cap * GiB if cap else None) for i, g in enumerate(gpus)]
    phs = [gm.Phase(f"p{i}", _fp(w), _fp(m) if m else None) for i, (w, m) in enumerate(phases)]
    try:
        plan = gm.plan_pool(mems, phs, cores=cores, requested=requested)
    except gm.DoesNotFit:
        assert any(all(g.usable - g.margin - (ph.main.total if ph.main and i == 0 else 0) < ph.per_worker.total
                       for i, g in enumerate(mems)) for ph in phs)
        return
    for ph in phs:
        n = plan.workers[ph.name]
        assert sum(n) >= 1 and all(k <= gm.WORKERS_PER_GPU for k in n)
        if requested is None and cores is not None:
            assert sum(n) <= max(1, cores - 1)
        if requested is not None:
            assert sum(n) <= requested
        for i, g in enumerate(mems):
            main = ph.main.total if ph.main is not None and i == 0 else 0
            if n[i]:
                share = plan.share(i, ph, n[i])
                assert share >= ph.per_worker.total                    # each worker gets at least its footprint
                assert n[i] * share + main + g.margin <= g.usable       # and all of them fit
        fraction = plan.main_fraction(ph, n[0])
        assert 0 < fraction <= 1


@pytest.mark.parametrize("text, size", [("32GiB", 32 * GiB), ("96GB", 96 * 10**9), ("80g", 80 * GiB),
                                        ("512 MiB", 512 * 2**20), ("1.5TiB", int(1.5 * 2**40))])
def test_a_memory_cap_is_read_with_its_unit(text, size):
    assert gm.parse_size(text) == size


@pytest.mark.parametrize("text", ["32", "32 apples", "-4GiB", "", "1KiB", "1e9GiB", "nanGiB"])
def test_a_memory_cap_without_a_unit_or_out_of_range_is_refused(text):
    with pytest.raises(gm.GpuMemoryError, match="AUTOTUNE_GPU_MEMORY"):
        gm.parse_size(text)


def test_a_bad_memory_cap_is_one_line_before_anything_runs(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("AUTOTUNE_GPU_MEMORY", "32")
    rc = main(["run", "--model", "qwen3.5-397b-a17b", "--tp", "8", "--dry-run", "--target-device", "NVIDIA H200",
               "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "write it with a unit, e.g. 32GiB" in err[0]


def test_footprints_grow_with_the_problem_and_shrink_with_fp8_weights():
    from autotune.families.triton_moe import TritonMoe

    fam, dev = TritonMoe(), planned_gpu("NVIDIA H200")
    small = fam.footprint(QWEN397_TP8, dev)
    for bigger in (Problem(512, 256, 4096, 10, "bf16"), Problem(512, 128, 8192, 10, "bf16"),
                   Problem(1024, 128, 4096, 10, "bf16"), Problem(512, 128, 4096, 10, "bf16", batch_sizes=(8192,))):
        assert fam.footprint(bigger, dev).total > small.total
    fp8 = fam.footprint(Problem(512, 128, 4096, 10, "fp8_w8a8_block"), dev)
    assert fp8.parts["weights"] < small.parts["weights"]
    # 397B TP8 bf16: both GEMMs' experts are 512 x 3 x 128 x 4096 bf16
    assert small.parts["weights"] == 512 * 3 * 128 * 4096 * 2


def test_the_dry_run_for_an_rtx_5090_prints_the_plan_on_a_machine_without_a_gpu(capsys, tmp_path):
    rc = main(["run", "--model", "qwen3.5-397b-a17b", "--tp", "8", "--dry-run", "--target-device",
               "NVIDIA GeForce RTX 5090", "--out", str(tmp_path / "o")])
    out = capsys.readouterr().out
    assert rc == 0 and "GPU memory plan (NVIDIA GeForce RTX 5090): 31.8 GiB" in out
    line = next(line for line in out.splitlines() if line.strip().startswith("Triton configs:"))
    # Triton compiles apart from the GPU: one measuring process, the builders (CPU) compile
    assert ("1 worker (set by compiling apart: one measuring process a GPU, builders compile) of 5.2 GiB for "
            "triton_moe E=512,N=128,K=4096,topk=10,bf16") in line
    assert "compiling: builder processes on the CPU (cores - 2 of the machine that runs it)" in out
    assert not (tmp_path / "o").exists()


def test_a_problem_too_big_for_the_card_is_left_out_with_why(capsys, tmp_path):
    # Qwen3.5-397B at TP1: 12 GiB of bf16 experts per worker and as much again for the layer check
    args = ["run", "--model", "qwen3.5-397b-a17b", "--dtype", "bf16", "--kernels", "triton_moe", "--dry-run",
            "--target-device", "NVIDIA GeForce RTX 5090", "--out", str(tmp_path / "o")]
    assert main([*args, "--tp", "1,8"]) == 0
    out = capsys.readouterr().out
    assert ("skip triton_moe E=512,N=1024,K=4096,topk=10,bf16: one worker needs 17.4 GiB of GPU memory" in out
            and "this process 16.3 GiB for its layer check" in out)
    assert main([*args, "--tp", "1"]) == 2
    err = capsys.readouterr().err
    assert "nothing to tune on this device" in err and "one worker needs 17.4 GiB" in err


def test_every_catalog_gpu_plans_the_default_job():
    for gpu in CATALOG:
        dev = planned_gpu(gpu.name)
        assert dev.sm == gpu.sm and dev.smem_optin == gpu.smem_optin and dev.num_sms == gpu.num_sms


def test_a_worker_makes_room_for_a_large_batch_before_building_it():
    """The kept inputs of earlier batch sizes are dropped, least recently used first, until the next
    batch size's need fits under the worker's limit (on the H100 a worker holding them ran its own
    M=4096 out of memory); what still fits beside it stays."""
    from autotune.families.triton_moe import TritonMoe
    from autotune.measure.measurer import ROOM, Measurer
    from autotune.problems.models import Problem
    from autotune.measure.tasks import Settings

    fam = TritonMoe()
    p = Problem(512, 128, 4096, 10, "bf16")
    m = Measurer(Settings(), lock_fd=-1)
    m.limit = 5 * GiB
    held = {}                                     # key -> bytes its inputs hold
    m._allocated = lambda: 1_500_000_000 + sum(held[k] for k in m.inputs)
    m._release = lambda: None
    for M in (1, 64, 1024, 2048):
        key = (fam.name, p.key, "down", M)
        m.inputs[key] = object()
        held[key] = fam.task_bytes(p, "down", M)
    need = fam.task_bytes(p, "down", 4096)
    assert m._allocated() + need > ROOM * m.limit          # as it was: no room for M=4096
    dropped = m.make_room(fam, p, "down", 4096)
    assert dropped >= 1 and m._allocated() + need <= ROOM * m.limit
    kept = [k[3] for k in m.inputs]
    assert kept == [1, 64, 1024, 2048][dropped:]            # least recently used went first
    assert m.make_room(fam, p, "down", 1) == 0              # a small one fits beside them: nothing dropped
