"""Tactics inside a backend: listed by the runner at each M, each measured and checked at every M
that offers it; a tactic wrong at one M, or one FlashInfer replaced by its default, is disqualified
alone and lands in a blocklist FlashInfer's own loader applies; the winners are pinned in a cache
FlashInfer's own loader serves."""
import json

import optuna
import pytest

from autotune.contract.config import KernelConfig
from autotune.search.context import SearchContext
from autotune.run.sinks import Summary
from autotune.search.sieve import BackendTuner, tactic_id
from autotune.gpus.device import DeviceInfo
from autotune.export import tactics as tactic_files
from autotune.folder.tuned import TunedFolder
from autotune.problems.models import Problem
from autotune.measure.records import config_key
from autotune.measure.tasks import Settings
from autotune.measure.pool import WorkerPool
from tests.fakes.tactic_backends import RUNNERS, TacticBackends

pytestmark = pytest.mark.slow      # a worker pool measuring every tactic

DEVICE = DeviceInfo("NVIDIA H200", 90, 232448, kind="cpu-interpreter")
PROBLEM = Problem(8, 32, 64, 2, "bf16", batch_sizes=(1, 2, 64))


@pytest.fixture(scope="module")
def tuned():
    fam = TacticBackends()
    settings = Settings(family=fam.spec, on_cpu=True, routings=1, repeats=5)
    storage = optuna.storages.InMemoryStorage()
    with WorkerPool(settings, n_workers=2, timeout_s=30) as pool:
        tuner = BackendTuner(SearchContext(storage, DEVICE, pool), PROBLEM, fam, careful_repeats=7)
        tuner.measure()
        choices = tuner.select()
        pinned = tuner.tactic_choices()
    tuner.pinned = pinned
    return fam, tuner, choices, storage


def cfg(t):
    return KernelConfig.from_entry({"backend": "tunable", "tactic": t})


def test_every_offered_tactic_is_measured_where_offered(tuned):
    _, tuner, _, _ = tuned
    for M in PROBLEM.batch_sizes:
        have = {m.config.get("tactic") for m in tuner.measured[M].values() if m.config["backend"] == "tunable"}
        assert have == {-1, 0, 1, 2, 3} | ({4} if M == 64 else set())
    assert tuner.measured[64][config_key(cfg(-1))].tactics == [-1, 0, 1, 2, 3, 4]


def test_a_bad_tactic_is_disqualified_alone_with_its_evidence(tuned):
    _, tuner, _, _ = tuned
    assert tuner.disqualified() == {}                  # the backend itself is fine
    bad = tuner.disqualified_tactics()
    assert set(bad) == {config_key(cfg(1)), config_key(cfg(2)), config_key({"backend": "pair", "tactic": [-1, 0]})}
    wrong = bad[config_key(cfg(1))]
    assert wrong.M == 2 and wrong.status == "wrong_result"          # right at M=1 and 64, wrong at 2
    assert tuner.measured[1][config_key(cfg(1))].ok
    fell_back = bad[config_key(cfg(2))]
    assert "FlashInfer ran tactic -1 in place of 2" in fell_back.reason   # right output, not the tactic


def test_the_winner_is_the_fastest_correct_tactic_everywhere(tuned):
    _, _, choices, _ = tuned
    assert set(choices) == {1, 2, 64}
    for c in choices.values():
        assert c.config == cfg(0)
        assert c.auto_us is not None and c.time_us < c.auto_us
        # tactic 1 was the fastest at M=1 and M=64 and is still never a candidate there
        assert all(x.finalist.configs["layer"].get("tactic") not in (1, 2) for x in c.candidates)


def test_each_tactic_is_re_timed_beside_its_default_and_pinned_on_that_pair(tuned):
    _, tuner, _, _ = tuned
    for M in PROBLEM.batch_sizes:
        paired = tuner.careful[("layer", M, config_key(cfg(0)))]
        # -1 costs 20 ms, tactic 0 1 ms (declared): both timed in the same hold of the worker
        assert paired.versus_us == pytest.approx(20 * paired.time_us)
        assert tuner.careful[("layer", M, config_key(cfg(-1)))].versus_us is None
        pin = tuner.pinned["tunable"][M]
        assert pin.config == cfg(0) and pin.auto_us == paired.versus_us


def test_the_studies_hold_every_tactic_as_an_integer_parameter(tuned):
    _, tuner, _, _ = tuned
    params = {t.params["tactic"] for t in tuner.studies[64].get_trials(deepcopy=False)
              if t.params["backend"] == "tunable"}
    assert params == {-1, 0, 1, 2, 3, 4}
    assert tactic_id([7, [[1, 2]]]) == tactic_id([7, [[1, 2]]]) != tactic_id([7, [[1, 3]]])
    assert tactic_id([7, [[1, 2]]]) > 1_000_000


def test_blocklist_is_applied_by_flashinfers_own_loader(tuned, tmp_path):
    from flashinfer.tactics_blocklist import TacticsBlocklist

    fam, tuner, _, _ = tuned
    invalid = tactic_files.blocklist_of(fam, [tuner])
    # the pair tactic [-1, 0] names gemm2's profile 0 under FlashInfer's gemm2 op of the MoE runner
    assert invalid == {"fp8_gemm::FakeFp8GemmRunner": [1, 2], "trtllm::fused_moe::gemm2::MoERunner": [0]}
    path = tmp_path / tactic_files.BLOCKLIST_FILE
    tactic_files.write_blocklist(path, invalid, tactic_files.blocklist_metadata("*"))
    bl = TacticsBlocklist()
    assert bl.load(str(path))

    class FakeFp8GemmRunner:       # FlashInfer keys the blocklist by the runner's class name
        pass
    assert bl.filter("fp8_gemm", FakeFp8GemmRunner(), [-1, 0, 1, 2, 3, 4]) == [-1, 0, 3, 4]
    # a later run adds what it found and keeps what the earlier one found
    tactic_files.write_blocklist(path, {"fp8_gemm::FakeFp8GemmRunner": [3]}, tactic_files.blocklist_metadata("*"))
    assert json.loads(path.read_text())["invalid_tactics"]["fp8_gemm::FakeFp8GemmRunner"] == [1, 2, 3]


def test_a_file_that_is_not_a_blocklist_is_left_alone(tmp_path):
    path = tmp_path / "mine.json"
    path.write_text('{"something": "else"}')
    with pytest.raises(ValueError, match="not a FlashInfer tactics blocklist; not overwritten"):
        tactic_files.write_blocklist(path, {"fp8_gemm::X": [1]}, tactic_files.blocklist_metadata("*"))
    assert path.read_text() == '{"something": "else"}'


def test_each_tunable_backend_gets_its_own_best_tactic_whichever_backend_wins(tuned):
    """FlashInfer's cache is read wherever SGLang runs that backend: `pair` never wins an M overall
    (slower than `tunable` everywhere), and still its best correct tactic is pinned for it."""
    _, tuner, choices, _ = tuned
    pinned = tuner.pinned
    assert set(pinned) == {"tunable", "pair"}
    assert all(c.config["backend"] == "tunable" for c in choices.values())
    for M in PROBLEM.batch_sizes:
        assert pinned["tunable"][M].config == cfg(0)
        assert pinned["pair"][M].config == KernelConfig.from_entry({"backend": "pair", "tactic": [0, 1]})
        for c in (pinned["tunable"][M], pinned["pair"][M]):
            assert c.time_us < c.auto_us            # beside its own default, both re-measured
            assert {json.dumps(x.finalist.configs["layer"]["tactic"]) for x in c.candidates} >= {"-1"}
    # the disqualified never reach the re-measurement
    assert not any(x.finalist.configs["layer"]["tactic"] in (1, 2, [-1, 0]) for per_m in pinned.values()
                   for c in per_m.values() for x in c.candidates)


def test_cache_entries_pin_the_winners(tuned):
    fam, tuner, _, _ = tuned
    entries = tactic_files.cache_entries_of(fam, [(PROBLEM, per_m) for per_m in tuner.pinned.values()])
    # `pair` (autotune's cutlass_fused_moe runner) keeps no entry of its own here
    assert [(e.profile[0][0], e.tactic) for e in entries] == [(1, 0), (2, 0), (64, 0)]
    assert {e.runner for e in entries} == {RUNNERS["tunable"].flashinfer_runner}


def test_a_run_writes_both_files_flashinfer_loads_and_server_args_say_how(tuned, tmp_path, capsys):
    from flashinfer.autotuner import AutoTuner
    from flashinfer.autotuner.autotuner import _collect_metadata

    from autotune.run import backend_choice
    from autotune.export import server_args

    fam, tuner, choices, _ = tuned
    device = DeviceInfo("NVIDIA H200", 90, 232448, kind="gpu",
                        versions={"flashinfer_metadata": _collect_metadata()})   # this machine's, as on a GPU
    backend_choice.write_tactic_files(TunedFolder.under(tmp_path, device), fam, [tuner],
                                    [(PROBLEM, per_m) for per_m in tuner.pinned.values()], Summary())
    folder = tmp_path / device.file_name
    cache = folder / tactic_files.CACHE_FILE
    assert AutoTuner().load_configs(str(cache))
    loaded = json.loads(cache.read_text())
    assert sorted(v[1] for k, v in loaded.items() if not k.startswith("_")) == [0, 0, 0]
    assert json.loads((folder / tactic_files.BLOCKLIST_FILE).read_text())["invalid_tactics"] == {
        "fp8_gemm::FakeFp8GemmRunner": [1, 2], "trtllm::fused_moe::gemm2::MoERunner": [0]}
    text = server_args.render({"device": device.to_dict(), "families": {}, "date": "today"},
                              folder / "server_args.yaml")
    assert f"FLASHINFER_TACTICS_BLOCKLIST={folder / tactic_files.BLOCKLIST_FILE}" in text
    assert f"({cache}) into SGLang's cache, one identical file per rank: autotune install {folder}" in text


def test_without_the_machines_flashinfer_versions_no_cache_is_written(tuned, tmp_path, capsys):
    from autotune.run import backend_choice

    fam, tuner, choices, _ = tuned
    device = DeviceInfo("NVIDIA H200", 90, 232448, kind="replay", versions={"torch": "2.11"})
    backend_choice.write_tactic_files(TunedFolder.under(tmp_path, device), fam, [tuner],
                                    [(PROBLEM, per_m) for per_m in tuner.pinned.values()], Summary())
    folder = tmp_path / device.file_name
    assert not (folder / tactic_files.CACHE_FILE).exists()
    assert "3 winning tactics not written" in capsys.readouterr().out
    assert (folder / tactic_files.BLOCKLIST_FILE).exists()      # the blocklist needs only the GPU's name


def test_with_no_tactic_over_its_default_the_run_says_so_and_writes_no_cache(tuned, tmp_path, capsys):
    from autotune.run import backend_choice
    from autotune.search.sieve import Choice

    fam, tuner, _, _ = tuned
    kept = {b: {M: Choice.layer(M, KernelConfig.from_entry({"backend": b, "tactic": -1}), c.auto_us, c.auto_us) for M, c in per_m.items()}
            for b, per_m in tuner.pinned.items()}
    device = DeviceInfo("NVIDIA H200", 90, 232448, kind="gpu", versions={"torch": "2.11"})
    backend_choice.write_tactic_files(TunedFolder.under(tmp_path, device), fam, [tuner],
                                    [(PROBLEM, per_m) for per_m in kept.values()], Summary())
    out = capsys.readouterr().out
    assert not (tmp_path / device.file_name / tactic_files.CACHE_FILE).exists()
    assert "no tactic beat its backend's default (-1) beyond the noise" in out
    assert "no tactic was disqualified" not in out          # two were: the blocklist says which


def test_the_table_names_the_winning_tactic(tuned):
    from autotune.run.report import backend_table

    _, tuner, choices, _ = tuned
    table = backend_table(tuner, choices)
    assert list(table["best"]) == ["tunable tactic 0"] * 3


def test_the_tactic_table_shows_each_backends_default_and_pick(tuned):
    from autotune.run.report import tactic_table

    _, tuner, _, _ = tuned
    rows = tactic_table(tuner, tuner.pinned).to_dict("records")
    assert [(r["backend"], r["M"], r["tactic"]) for r in rows] == [
        ("pair", M, "[0, 1]") for M in PROBLEM.batch_sizes] + [("tunable", M, "0") for M in PROBLEM.batch_sizes]
    assert all(r["speedup"] > 1 and r["spread"] is not None for r in rows)


def test_tactics_of_two_parts_are_searched_part_by_part_then_together(tuned):
    """cutlass_fused_moe's [gemm1, gemm2]: each part's profiles with the other at its default, then
    per M the best of each part together; a part's profile wrong at one M is out at every M and is
    never combined."""
    _, tuner, _, _ = tuned
    bad = tuner.disqualified_tactics()
    assert config_key({"backend": "pair", "tactic": [-1, 0]}) in bad
    assert bad[config_key({"backend": "pair", "tactic": [-1, 0]})].M == 64
    for M in PROBLEM.batch_sizes:
        have = {json.dumps(m.config["tactic"]) for m in tuner.measured[M].values() if m.config["backend"] == "pair"}
        assert have == {"-1", "[0, -1]", "[1, -1]", "[-1, 0]", "[-1, 1]", "[0, 1]"}   # [0, 1]: the two bests
        both = tuner.measured[M][config_key({"backend": "pair", "tactic": [0, 1]})]
        assert both.ok and both.time_us < tuner.measured[M][config_key({"backend": "pair", "tactic": -1})].time_us
    assert not any(m.config.get("tactic") == [0, 0] for d in tuner.measured.values() for m in d.values())
