"""Compiling apart from measuring (autotune.measure.builders): the builders' kernels are the ones the measuring
process looks up, and nothing a builder does (an error, a crash, a hang) becomes a measurement's verdict."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from autotune.contract.config import KernelConfig
from autotune.measure import records
from autotune.measure.builders import Building
from autotune.measure.pool import WorkerPool
from autotune.measure.tasks import Settings, Task
from autotune.problems.models import Problem
from tests.fakes.faulty_family import run_all

pytestmark = pytest.mark.slow      # processes and real compiles
ROOT = Path(__file__).resolve().parents[2]


def test_stand_ins_specialise_as_the_measured_inputs():
    """Triton keys a compiled kernel by what the launch's arguments are (dtypes, alignment, divisibility,
    constexprs): the builder's stand-in tensors, shapes only, give the key the measuring process's real inputs
    give (SGLang's alignment buffers sized by its own wrapper in both), for bf16 and block-FP8 experts, both GEMMs,
    a TMA down GEMM, small and large batches; and SGLang's SM90 launch with programmatic dependent launch is
    what the builder compiles."""
    code = textwrap.dedent("""
        import dataclasses, json
        import torch
        from autotune.families.triton_moe import TritonMoe
        from autotune.families.triton_moe.apart import compiling_for, stand_in_inputs
        from autotune.families.triton_moe.moe_align import sglang_alignment_buffers
        from autotune.problems.models import Problem
        fam, out = TritonMoe(), []
        base = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4,
                "num_stages": 3}
        cases = [("bf16", "gate_up", 1, base), ("bf16", "down", 9, {**base, "BLOCK_SIZE_M": 32}),
                 ("bf16", "gate_up", 600, {**base, "BLOCK_SIZE_M": 64}),
                 ("fp8_w8a8_block", "gate_up", 3, base),
                 ("fp8_w8a8_block", "down", 64, {**base, "BLOCK_SIZE_M": 64, "USE_TMA": True})]
        from autotune.contract.config import KernelConfig
        with compiling_for(90):
            for dtype, gemm, M, entry in cases:
                cfg = KernelConfig.from_entry(entry)
                p = Problem(32, 256, 512, 4, dtype)
                built = fam.compile_apart(cfg, p, gemm, M)
                # the GPU's inputs: made as make_inputs makes them there, bf16 operands (the CPU's are float32)
                real = fam.make_inputs(p, gemm, M, routings=1, on_cpu=True)
                bf = torch.bfloat16
                real = dataclasses.replace(real, on_cpu=False, A=[a.to(bf) for a in real.A], C=real.C.to(bf),
                                           B=real.B if dtype != "bf16" else real.B.to(bf))
                real._aligned[cfg["BLOCK_SIZE_M"], 0] = sglang_alignment_buffers(real.topk_ids[0], cfg["BLOCK_SIZE_M"], p.E)
                measured = fam.compile(cfg, real)
                out.append([built.hash, measured.hash, bool(built.metadata.launch_pdl)])
        print(json.dumps(out))
    """)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(Path(os.environ.get("TMPDIR", "/tmp")) / f"autotune-test-triton-{os.getpid()}")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert len(got) == 5
    for built, measured, pdl in got:
        assert built == measured and pdl


PROBLEM = Problem(8, 32, 64, 2, "bf16", batch_sizes=(1, 2))


def _run(pool, tasks):
    return run_all(pool, tasks, key="build", limit=300)


def test_every_task_is_built_apart_first_and_a_failed_build_is_never_a_verdict(tmp_path, monkeypatch):
    """Builders compile each task at each batch size before a worker measures it; a build that raises, crashes
    its builder or hangs it only loses the forecast: the task is still measured, and the measurement (here a
    right one) is its verdict. A dead or hung builder is replaced and the pool goes on."""
    monkeypatch.setenv("FAULTY_STATE", str(tmp_path))
    settings = Settings(family="tests.fakes.faulty_family:FaultyBuilds", on_cpu=True, routings=1)
    builds = ["ok", "error", "crash", "hang", "ok2"]
    with WorkerPool(settings, n_workers=1, timeout_s=8, building=Building(2, 90)) as pool:
        out = _run(pool, [Task(PROBLEM.to_dict(), PROBLEM.key, "g", KernelConfig.from_entry({"mode": "ok", "build": b}), [1, 2])
                          for b in builds])
        pace = pool.pace
    assert set(out) == set(builds)
    for b in builds:
        assert all(m.status == records.OK for m in out[b].values()), (b, out[b])
    built = sorted(f.name for f in tmp_path.iterdir() if f.name.startswith("built-"))
    assert built == ["built-ok-ok-1", "built-ok-ok-2", "built-ok-ok2-1", "built-ok-ok2-2"]
    assert pace.builds_lost == 2 and pace.measurements == 2 * len(builds)


def test_a_task_waiting_behind_a_crash_or_a_hang_is_measured_and_not_blamed(tmp_path, monkeypatch):
    """With builders, a worker holds a second task behind the one it measures (so it never waits for this process
    between tasks). When the task it measures crashes its process or hangs it, only that task fails; the one
    waiting behind it never started, goes back first in the queue, and is measured right on the new worker."""
    monkeypatch.setenv("FAULTY_STATE", str(tmp_path))
    settings = Settings(family="tests.fakes.faulty_family:FaultyBuilds", on_cpu=True, routings=1)
    modes = {"a": "ok", "b": "crash", "c": "ok", "d": "hang", "e": "ok", "f": "ok"}
    behind = []
    with WorkerPool(settings, n_workers=1, timeout_s=6, building=Building(2, 90)) as pool:
        real_send = pool._send

        def send(slot, task, Ms):
            behind.append(slot.task is not None)
            real_send(slot, task, Ms)
        pool._send = send
        out = _run(pool, [Task(PROBLEM.to_dict(), PROBLEM.key, "g", KernelConfig.from_entry({"mode": m, "build": b}), [1, 2])
                          for b, m in modes.items()])
        replaced = pool.replaced
    assert any(behind), "no task was handed to a worker behind the one it measured"
    assert set(out) == set(modes)
    for b, mode in modes.items():
        want = {"ok": {records.OK}, "crash": {records.CRASH}, "hang": {records.TIMEOUT}}[mode]
        assert {m.status for m in out[b].values()} == want, (b, out[b])
    assert replaced == 2
