"""A resource failure (CUDA out of memory, a busy device, a context lost to either) is the machine's state,
never a config's verdict: the pool measures it again with fewer workers, a study never stores it, and a
storage of an earlier release that holds one as a runtime error or a crash measures it again on resume."""
import optuna
import pytest

from autotune.contract.config import KernelConfig
from autotune.measure import records
from autotune.gpus.device import cpu_interpreter
from autotune.errors import GpuMemoryExhausted
from autotune.measure.measurer import classify
from autotune.problems.models import Problem
from autotune.measure.records import Measurement, is_resource_failure
from autotune.store.storage import ATTR, Store
from autotune.search.context import SearchContext
from autotune.search.study import ProblemTuner, TuneSettings
from autotune.measure.tasks import Settings, Task, run_tasks
from autotune.measure.pool import WorkerPool
from tests.fakes.faulty_family import OomBeforeLaunch, OomFaulty

PROBLEM = Problem(8, 32, 64, 2, "bf16", batch_sizes=(1, 2))
OOM = "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB"


def test_classify_says_resource_for_memory_and_busy_devices_only():
    import torch

    class OutOfResources(Exception):
        pass
    assert classify(torch.OutOfMemoryError(OOM)) == (records.RESOURCE, False)    # the allocator refused: context intact
    assert classify(RuntimeError("CUDA error: out of memory")) == (records.RESOURCE, True)
    assert classify(RuntimeError("CUDA error: CUDA-capable device(s) is/are busy or unavailable")) == (records.RESOURCE, True)
    assert classify(RuntimeError("CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate(handle)")) == (records.RESOURCE, True)
    # a config's own limits stay its verdict
    assert classify(OutOfResources("out of resource: shared memory, Required: 262144"))[0] == records.OUT_OF_RESOURCES
    assert classify(RuntimeError("CUDA error: an illegal memory access was encountered")) == (records.RUNTIME_ERROR, True)


@pytest.mark.parametrize("status, reason, resource", [
    (records.RUNTIME_ERROR, f"building inputs: OutOfMemoryError: {OOM}", True),
    (records.RUNTIME_ERROR, f"first launch: OutOfMemoryError: {OOM}", True),
    (records.CRASH, "CUDA context lost (first launch: AcceleratorError: CUDA error: out of memory); worker exited with "
                    "code 3 at M=2048", True),
    (records.CRASH, "worker exited with code 3 (CUDA-capable device(s) is/are busy or unavailable)", True),
    (records.RESOURCE, "anything", True),
    (records.RUNTIME_ERROR, "first launch: RuntimeError: CUDA error: an illegal memory access was encountered", False),
    (records.CRASH, "worker killed by SIGSEGV", False),
    (records.WRONG_RESULT, "relative error 0.8 > 0.01 (out of memory is not said by wrong results)", False),
    (records.OUT_OF_RESOURCES, "out of resource: shared memory", False),
])
def test_earlier_releases_rows_are_read_as_resource_failures_by_their_reason(status, reason, resource):
    m = records.failure("p", "gate_up", 8, KernelConfig.from_entry({"BLOCK_SIZE_M": 16}), status, reason)
    assert is_resource_failure(m) is resource



@pytest.mark.parametrize("mode, stage", [("oom_building", "building inputs"), ("oom_compiling", "compiling")])
def test_out_of_memory_before_the_launch_is_the_machines_failure_never_the_configs(mode, stage):
    """Out of memory while the inputs are built or the kernel compiles is a resource failure (measured again,
    never stored as the config's verdict), not a compile error; the worker's context is intact."""
    from autotune.measure.measurer import Measurer

    m, fatal = Measurer(Settings(family=OomBeforeLaunch.spec, on_cpu=True, routings=1), None).measure(
        Task(PROBLEM.to_dict(), PROBLEM.key, "g", KernelConfig.from_entry({"mode": mode}), [1], family=OomBeforeLaunch.spec), PROBLEM, 1)
    assert (m.status, fatal) == (records.RESOURCE, False) and is_resource_failure(m)
    assert m.reason.startswith(f"{stage}: OutOfMemoryError: CUDA out of memory")

# --- the pool measures a resource failure again, with fewer workers ------------------------------

def _run(pool, tasks):
    out = {}
    run_tasks(pool, tasks, lambda task, ms: out.setdefault(task.config["mode"], []).extend(ms))
    return out


@pytest.fixture()
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("FAULTY_STATE", str(tmp_path))
    return tmp_path


def _task(mode, Ms=(1, 2)):
    return Task(PROBLEM.to_dict(), PROBLEM.key, "g", KernelConfig.from_entry({"mode": mode}), list(Ms))


def _two_phases():
    """A memory plan of two steps, two workers each on one 80 GiB GPU (autotune.gpus.memory_plan)."""
    from autotune.gpus import memory_plan as gm
    from autotune.gpus.catalog import GiB

    fp = gm.Footprint("w", {"x": 4 * GiB})
    return gm.plan_pool([gm.GpuMemory(0, 80 * GiB, 80 * GiB)], [gm.Phase("configs", fp), gm.Phase("backends", fp)],
                        cores=None, requested=2)


def test_out_of_memory_is_measured_again_and_never_returned(state):
    settings = Settings(family="tests.fakes.faulty_family:Faulty", on_cpu=True, routings=1)
    plan = _two_phases()
    with WorkerPool(settings, n_workers=2, timeout_s=60, memory_plan=plan) as pool:
        out = _run(pool, [_task("oom_once"), _task("ok")])
        assert [m.M for m in out["oom_once"]] == [1, 2] and all(m.ok for m in out["oom_once"])
        assert all(m.ok for m in out["ok"])
        assert pool.resource_retries >= 2
        assert pool.retired >= 1 and len(pool.slots) == 1       # the GPU lost a worker to the shortage
        # the next step of the plan starts with one fewer too: a shortage is the GPU's, not the step's
        assert plan.workers["backends"] == (2,)
        pool.use_phase("backends")
        assert len(pool.slots) == 1 and _run(pool, [_task("ok")])["ok"][0].ok


@pytest.mark.slow      # a worker's death and its replacement's start (the quick test above keeps the retry)
def test_cudas_own_out_of_memory_replaces_the_worker_and_measures_again(state):
    """CUDA's own out-of-memory poisons the context: the worker is replaced and the rest measured again."""
    settings = Settings(family="tests.fakes.faulty_family:Faulty", on_cpu=True, routings=1)
    with WorkerPool(settings, n_workers=2, timeout_s=60) as pool:
        out = _run(pool, [_task("cuda_oom_once"), _task("ok")])
        assert [m.M for m in out["cuda_oom_once"]] == [1, 2] and all(m.ok for m in out["cuda_oom_once"])
        assert all(m.ok for m in out["ok"])
        assert pool.resource_retries >= 2 and pool.replaced >= 1


def test_out_of_memory_with_one_worker_left_stops_the_run_in_one_line(state):
    settings = Settings(family="tests.fakes.faulty_family:Faulty", on_cpu=True, routings=1)
    with WorkerPool(settings, n_workers=1, timeout_s=60) as pool:
        with pytest.raises(GpuMemoryExhausted, match=r"M=1: .*OutOfMemoryError.* \(3 tries, GPU 0 down to one "
                                                      r"worker\).*nothing measured is lost"):
            _run(pool, [_task("oom_always", [1])])


@pytest.mark.slow      # a whole search on a pool: the rule is quick at the measurer and the pool above
def test_a_study_never_stores_a_resource_failure(state, tmp_path):
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 's.db'}")
    settings = Settings(family=OomFaulty.spec, on_cpu=True, routings=1)
    with WorkerPool(settings, n_workers=2, timeout_s=60) as pool:
        tuner = ProblemTuner(SearchContext(storage, cpu_interpreter(), pool,
                                           TuneSettings(trials=2, startup=2, neighbours=1)), PROBLEM, OomFaulty())
        tuner.search()
    stored = [Measurement.from_dict(t.user_attrs[ATTR]) for s in optuna.get_all_study_summaries(storage)
              for t in optuna.load_study(study_name=s.study_name, storage=storage).get_trials()
              if ATTR in t.user_attrs]
    assert stored and all(m.ok for m in stored), [(m.config, m.status, m.reason) for m in stored]
    assert {m.config["mode"] for m in stored} == {"ok", "oom_once"}


# --- a storage of an earlier release heals itself --------------------------------------------------

def test_an_old_storages_out_of_memory_rows_are_measured_again_on_resume(state, tmp_path):
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 's.db'}")
    fam, dev = OomFaulty(), cpu_interpreter()
    # what an earlier release stored: "oom_once" told as a runtime error of the config at M=1, asked,
    # and a careful re-measurement of "ok" lost to out of memory
    dists = {("g", M): {"mode": optuna.distributions.IntDistribution(0, 1)} for M in PROBLEM.batch_sizes}
    store = Store(storage, dists)
    from autotune.store.storage import config_study_name
    study = store.open(("g", 1), config_study_name(fam.name, dev.file_name, PROBLEM.key, "g", 1))
    old = records.failure(PROBLEM.key, "g", 1, KernelConfig.from_entry({"mode": "oom_once"}), records.RUNTIME_ERROR,
                          f"first launch: OutOfMemoryError: {OOM}")
    study.add_trial(optuna.trial.create_trial(params={"mode": 1}, distributions=dists["g", 1], value=float("inf"),
                                              user_attrs={ATTR: old.to_dict(), "asked": True}))
    careful = records.failure(PROBLEM.key, "g", 1, KernelConfig.from_entry({"mode": "ok"}), records.CRASH,
                              "CUDA context lost (timing: CUDA error: out of memory); worker exited with code 3")
    study.set_user_attr('careful:{"mode":"ok"}', careful.to_dict())

    settings = Settings(family=OomFaulty.spec, on_cpu=True, routings=1)
    with WorkerPool(settings, n_workers=1, timeout_s=60) as pool:
        tuner = ProblemTuner(SearchContext(storage, dev, pool, TuneSettings(trials=2, startup=2, neighbours=0)), PROBLEM, fam)
        assert tuner.known("g", 1, KernelConfig.from_entry({"mode": "oom_once"})) is None           # read as not measured
        assert not tuner.careful                                              # the careful one too
        tuner.search()
    again = tuner.known("g", 1, KernelConfig.from_entry({"mode": "oom_once"}))
    assert again is not None and again.ok                                    # measured again, correct this time
    assert "healed:0" in study.user_attrs
    # the resumed run's budget did not count the old row as a measured ask
    assert tuner.slots["g", 1].asked == 2
