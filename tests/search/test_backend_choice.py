"""Backend choice end to end on the CPU: a NaN-at-one-M, a zeros, a crashing and a hanging
backend are each disqualified with their reason, and the correct winner is exported."""
import argparse

import optuna
import pytest

from autotune.contract.config import KernelConfig
from autotune.search.context import SearchContext
from autotune.search.sieve import BackendTuner
from autotune.search.server_choice import server_choice
from autotune.gpus.device import DeviceInfo
from autotune.export import server_args
from autotune.folder.tuned import TunedFolder
from autotune.problems.models import Problem
from autotune.measure.tasks import Settings
from autotune.measure.pool import WorkerPool
from tests.fakes.faulty_backends import FaultyBackends

pytestmark = pytest.mark.slow      # a worker pool measuring every backend

DEVICE = DeviceInfo("NVIDIA RTX PRO 6000 Blackwell Server Edition", 120, 101376, kind="cpu-interpreter")
PROBLEM = Problem(8, 32, 64, 2, "bf16", batch_sizes=(1, 2, 64, 1024))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("choice")
    fam = FaultyBackends()
    settings = Settings(family="tests.fakes.faulty_backends:FaultyBackends", on_cpu=True, routings=1, repeats=5)
    with WorkerPool(settings, n_workers=3, timeout_s=6) as pool:
        tuner = BackendTuner(SearchContext(optuna.storages.InMemoryStorage(), DEVICE, pool), PROBLEM, fam, careful_repeats=7)
        tuner.measure()
        choices = tuner.select()
    decode = server_choice(fam, DEVICE, [tuner], "decode")
    path = server_args.write(TunedFolder.under(tmp, DEVICE), [([decode], fam)], None, {})
    return tuner, choices, decode, path


def test_each_broken_backend_is_disqualified_with_its_evidence(run):
    tuner, _, _, _ = run
    bad = tuner.disqualified()
    assert set(bad) == {"nan_at_2", "zeros", "crash", "hang"}
    assert bad["nan_at_2"].M == 2 and "NaN" in bad["nan_at_2"].reason     # fine at M=1, caught at M=2
    assert bad["zeros"].status == "wrong_result" and "relative error" in bad["zeros"].reason
    assert bad["crash"].status == "crash" and "SIGSEGV" in bad["crash"].reason
    assert "worker killed by SIGSEGV in tests/fakes/faulty_backends.py:97 in run" in bad["crash"].reason
    assert bad["hang"].status == "timeout"
    # asked before it was killed, the hung worker said where it waits: the backend's own line, not threading's
    assert "(hang; stuck in tests/fakes/faulty_backends.py:99 in run)" in bad["hang"].reason


def test_per_M_winner_is_the_fast_correct_backend_everywhere(run):
    _, choices, _, _ = run
    assert set(choices) == {1, 2, 64, 1024}
    for c in choices.values():
        assert c.config["backend"] == "good_fast"
        assert c.auto_us is not None and c.time_us < c.auto_us
        # a disqualified backend is never even a candidate, also at the Ms where it ran fine
        assert all(x.finalist.configs["layer"]["backend"] in ("good_fast", "good_slow") for x in c.candidates)


def test_server_args_name_the_winner_and_the_reasons(run):
    _, _, decode, path = run
    assert decode.backend == "good_fast" and decode.gain_vs_auto == pytest.approx(4.0)   # 8 ms / 2 ms, declared
    text = path.read_text()
    assert "moe-runner-backend: flashinfer_cutlass" in text
    for b in ("nan_at_2", "zeros", "crash", "hang"):
        assert f"disqualified {b}:" in text
    assert "skipped missing: needs a GPU" in text
    assert "skipped no_module: unavailable on this machine (first launch: ModuleNotFoundError: No module named " \
           "'sgl_kernel_that_this_machine_lacks'); not stored, a re-run retries it" in text
    assert server_args.read_values(path) == {"moe-runner-backend": "flashinfer_cutlass"}


def test_a_backend_whose_module_is_missing_is_skipped_and_retried_later(run):
    """A missing module is the machine's fault: never a disqualification, never stored in the study
    (session 3 stored one, and every later run on that storage replayed the failure)."""
    tuner, _, decode, _ = run
    assert "no_module" not in tuner.disqualified() and "no_module" not in decode.totals
    assert {M for M, _ in tuner.unavailable} == {1, 2, 64, 1024}
    stored = [t.params["backend"] for s in tuner.studies.values() for t in s.get_trials(deepcopy=False)]
    assert "no_module" not in stored and "good_fast" in stored


def test_sglang_own_config_loader_accepts_the_file(run):
    """SGLang's --config merger + its argument parser read our file into its server args."""
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger

    _, _, _, path = run
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    argv = ConfigArgumentMerger(parser).merge_config_with_args(["--model-path", "m", "--config", str(path)])
    assert parser.parse_args(argv).moe_runner_backend == "flashinfer_cutlass"
