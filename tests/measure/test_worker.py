"""Worker isolation: each kind of failure fails its measurement with a reason; the pool survives."""

import pytest

from autotune.contract.config import KernelConfig
from autotune.measure import records
from autotune.measure.measurer import classify
from autotune.problems.models import Problem
from autotune.measure.tasks import Settings, Task
from autotune.measure.pool import WorkerPool
from tests.fakes.faulty_family import run_all

pytestmark = pytest.mark.slow      # a pool of worker processes per test module

PROBLEM = Problem(8, 32, 64, 2, "bf16", batch_sizes=(1, 2))


@pytest.fixture(scope="module")
def results():
    settings = Settings(family="tests.fakes.faulty_family:Faulty", on_cpu=True, routings=1)
    modes = ["ok", "nan_at_2", "zeros", "unwritten", "crash", "hang", "compile", "oor", "cuda_fatal"]
    with WorkerPool(settings, n_workers=3, timeout_s=6) as pool:
        tasks = [Task(PROBLEM.to_dict(), PROBLEM.key, "g", KernelConfig.from_entry({"mode": m}), [1, 2]) for m in modes]
        out = run_all(pool, tasks)
        # the pool still measures after crashes, hangs and poisoned contexts
        after = run_all(pool, [Task(PROBLEM.to_dict(), PROBLEM.key, "g", KernelConfig.from_entry({"mode": "ok"}), [2])])
        replaced = pool.replaced
    return out, after, replaced


def test_good_config_is_measured(results):
    out, _, _ = results
    assert all(m.ok and m.time_us > 0 and m.error == 0 for m in out["ok"].values())


@pytest.mark.parametrize("mode, status, reason", [
    ("zeros", records.WRONG_RESULT, "relative error"),
    ("unwritten", records.WRONG_RESULT, "never written"),
    ("crash", records.CRASH, "SIGSEGV"),
    ("hang", records.TIMEOUT, "no progress"),
    ("compile", records.COMPILE_ERROR, "unsupported layout"),
    ("oor", records.OUT_OF_RESOURCES, "shared memory"),
])
def test_failure_is_recorded_with_reason_at_every_M(results, mode, status, reason):
    out, _, _ = results
    assert set(out[mode]) == {1, 2}
    for m in out[mode].values():
        assert m.status == status and reason in m.reason, (m.status, m.reason)


def test_poisoned_cuda_context_fails_the_rest_and_replaces_the_worker(results):
    out, _, _ = results
    first, rest = out["cuda_fatal"][1], out["cuda_fatal"][2]
    assert first.status == records.RUNTIME_ERROR and "illegal memory access" in first.reason
    assert rest.status == records.CRASH and "CUDA context lost" in rest.reason


def test_nan_at_one_M_fails_only_that_M(results):
    out, _, _ = results
    assert out["nan_at_2"][1].ok
    assert out["nan_at_2"][2].status == records.WRONG_RESULT and "NaN" in out["nan_at_2"][2].reason


def test_pool_replaced_dead_workers_and_went_on(results):
    _, after, replaced = results
    assert replaced >= 3                     # crash, hang, poisoned context
    assert after["ok"][2].ok


def test_classify_triton_errors():
    class OutOfResources(Exception):
        pass
    assert classify(OutOfResources("x")) == (records.OUT_OF_RESOURCES, False)
    assert classify(RuntimeError("PassManager::run failed")) == (records.COMPILE_ERROR, False)
    assert classify(RuntimeError("CUDA error: misaligned address")) == (records.RUNTIME_ERROR, True)
    assert classify(ValueError("bad")) == (records.RUNTIME_ERROR, False)


def test_a_compile_failure_is_one_line_and_its_compiler_dump_goes_to_the_log(tmp_path, capfd):
    log = tmp_path / "workers.log"
    settings = Settings(family="tests.fakes.faulty_family:Faulty", on_cpu=True, routings=1, log_path=str(log))
    with WorkerPool(settings, n_workers=1, timeout_s=30) as pool:
        out = run_all(pool, [Task(PROBLEM.to_dict(), PROBLEM.key, "g", KernelConfig.from_entry({"mode": "compile"}), [1])])
    m = out["compile"][1]
    assert m.status == records.COMPILE_ERROR and "\n" not in m.reason
    assert "unsupported layout (at 12:4)" in m.reason and "worker log" in m.reason
    terminal = capfd.readouterr()
    assert "IR Dump" not in terminal.err + terminal.out          # the user's terminal stays clean
    text = log.read_text()
    assert "IR Dump Before" in text and "acc = tl.dot" in text    # the whole dump and error, kept
