"""The two rules that decide what is written when two timings compete, each through a second path
beside its first test:

- export keeps an existing entry measured faster on the same stack (first: tests/families/triton_moe/test_sglang_files.py,
  export_problem called directly; here: `autotune run` into a folder an earlier run wrote, from a
  recording whose every time is 25% slower or faster);
- the one backend per server stays SGLang's `auto` unless another beats it beyond the noise of both
  sides' timings (first: the H200 sieve replayed, tests/search/test_sieve_h200_replay.py; here:
  server_choice over tuners whose times and spreads are set, either side of the line)."""
import json
from dataclasses import dataclass, field, replace
from types import SimpleNamespace

import pytest

from autotune.contract.config import KernelConfig
from autotune.contract.capabilities import Availability
from autotune.cli import main
from autotune.contract.runner import Runner
from autotune.measure.timing import MIN_EFFECT, noise
from autotune.measure.records import read_cache, write_cache
from autotune.search.server_choice import ServerChoice, server_choice
from tests.conftest import GRID

PROBLEM = "E=512,N=128,K=4096,topk=10,bf16"
MS = (1, 8)


def scaled_recording(path, factor: float):
    """The H200 grid's records of one problem at MS, every time multiplied by `factor`."""
    cache = read_cache(GRID)
    cache.problems = {PROBLEM: cache.problems[PROBLEM]}
    for book in (cache.records, cache.careful):
        for key, m in list(book.items()):
            if m.problem != PROBLEM or m.M not in MS:
                del book[key]
            elif m.time_us is not None:
                book[key] = replace(m, time_us=m.time_us * factor)
    write_cache(path, cache)
    return path


@pytest.fixture(scope="module")
def recordings(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("scaled")
    return {f: scaled_recording(tmp / f"x{f}.jsonl.gz", f) for f in (1.0, 1.25, 0.8)}


def run_into(out, recording, db, capsys):
    capsys.readouterr()
    rc = main(["run", "--model", "qwen3.5-397b-a17b", "--tp", "8", "--dtype", "bf16", "--replay", str(recording),
               "--batch-sizes", ",".join(map(str, MS)), "--trials", "3", "--quiet", "--out", str(out),
               "--storage", f"sqlite:///{db}"])
    assert rc == 0
    folder = out / "NVIDIA_H200"
    (entry,) = json.loads((folder / "provenance.json").read_text())["files"].values()
    files = {p.name: p.read_bytes() for p in (folder / "configs").rglob("E=512,N=128,*.json")}
    return entry, files, capsys.readouterr().out


def test_a_rerun_keeps_the_faster_existing_entries_and_replaces_the_slower(tmp_path, recordings, capsys):
    out = tmp_path / "out"
    first, files, _ = run_into(out, recordings[1.0], tmp_path / "a.db", capsys)
    was = {M: first["per_M"][str(M)]["tuned_us"] for M in MS}
    # every new time 25% slower: each M keeps what the first run wrote, and says so
    slower, kept_files, text = run_into(out, recordings[1.25], tmp_path / "b.db", capsys)
    assert kept_files == files
    assert {M: slower["per_M"][str(M)]["tuned_us"] for M in MS} == was
    assert sorted(int(M) for M in slower["kept_existing"]) == list(MS)
    for M in MS:
        assert f"M={M}: kept the existing config (existing {was[M]:.2f} us beats new" in text
    # every new time 20% faster: each M is replaced by the new measurement
    faster, _, text = run_into(out, recordings[0.8], tmp_path / "c.db", capsys)
    assert faster["kept_existing"] == {} and "kept the existing config" not in text
    for M in MS:
        assert faster["per_M"][str(M)]["tuned_us"] == pytest.approx(0.8 * was[M], rel=0.02)


def test_the_same_timing_read_back_from_provenance_is_not_faster(tmp_path):
    """Provenance keeps 3 decimals: a re-export of the very same measurement (a re-run into its own
    folder) compared the rounded-down stored time against the exact new one and said "existing
    67.87 us beats new 67.87 us"; a new entry 0.001 us slower as stored is still beaten."""
    from autotune.gpus.device import DeviceInfo
    from autotune.families.triton_moe.export import export_problem
    from autotune.folder.tuned import TunedFolder
    from autotune.search.finalists import Choice
    from autotune.problems.models import Problem

    cfg = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4,
           "num_stages": 4}
    other = {**cfg, "BLOCK_SIZE_N": 32}
    dev = DeviceInfo("NVIDIA H200", 90, 232448, versions={"triton": "3.6.0"})
    p = Problem(512, 128, 4096, 10, "bf16", batch_sizes=(1,))

    def export(c, gate_up_us):
        return export_problem(TunedFolder.under(tmp_path, dev), p, {1: Choice.pair(1, (KernelConfig.from_entry(c),) * 2, (gate_up_us, 10.0))}, {})
    assert export(cfg, 10.4444)["kept"] == {}
    assert export(other, 10.4444)["kept"] == {}                   # level as stored: the new one is written
    assert export(cfg, 10.4454)["kept"] == {1: "existing 20.44 us beats new 20.45 us"}


def test_publish_keeps_the_serving_repos_faster_entries_of_the_same_stack():
    """The publish merge (first: tests/publish/test_publish.py, through the command): per M, the serving
    repo's entry stays where it was measured faster on the same device and versions."""
    from autotune.publish import merge_file

    stack = {"device": "NVIDIA H200", "versions": {"triton": "3.6.0", "sglang": "0.5.23"}}

    def prov(**per_m):
        return {**stack, "per_M": {M[1:]: {"tuned_us": us} for M, us in per_m.items()}}
    ours = {"1": {"ours": 1}, "8": {"ours": 8}, "64": {"ours": 64}}
    theirs = {"1": {"theirs": 1}, "8": {"theirs": 8}, "4096": {"theirs": 4096}}
    merged, per_m, kept = merge_file(ours, prov(M1=12.0, M8=30.0, M64=50.0), theirs, prov(M1=10.0, M8=31.0, M4096=99.0))
    assert merged == {"1": {"theirs": 1}, "8": {"ours": 8}, "64": {"ours": 64}, "4096": {"theirs": 4096}}
    assert kept == {"1": "serving repo's 10.00 us beats ours 12.00 us"}
    assert per_m["1"]["tuned_us"] == 10.0 and per_m["8"]["tuned_us"] == 30.0
    # measured on another stack: nothing of theirs is compared, ours is published as it is
    elsewhere = {**prov(M1=1.0), "versions": {"triton": "3.5.1", "sglang": "0.5.23"}}
    assert merge_file(ours, prov(M1=12.0), theirs, elsewhere)[0] == ours


# --- within noise: SGLang's auto stays --------------------------------------------------------------

@dataclass
class Timed:
    """A backend tuner as server_choice reads it: per (backend, M), a time and its spread."""
    problem: object
    times: dict                                   # (backend, M) -> (us, spread)
    Ms: list = field(default_factory=lambda: [1, 8, 64, 1024])

    @property
    def names(self):
        return tuple(sorted({b for b, _ in self.times}))

    def disqualified(self):
        return {}

    def skipped_here(self):
        return {}

    def time_of(self, b, M):
        return self.times.get((b, M), (None, 0.0))[0]

    def spread_of(self, b, M):
        return self.times.get((b, M), (None, 0.0))[1]


class TwoBackends:
    """`auto_one` is SGLang's auto; `other` competes with it."""
    name = "moe_bf16"

    def availability(self, device):
        return [Availability(Runner(self.name, b, b, "test"), True) for b in ("auto_one", "other")]

    def sglang_value(self, b):
        return b

    def sglang_auto(self, device):
        return "auto_one"


def tuners(auto_us: float, other_us: float, auto_spread: float, other_spread: float) -> list:
    """Two problems (weights 1 and 3 per forward pass), each M of the decode mix at the same times;
    the prefill M (1024) slower for both, outside the mix."""
    out = []
    for key, layers in (("p1", 1), ("p2", 3)):
        times = {}
        for M in (1, 8, 64):
            times[("auto_one", M)] = (auto_us * M, auto_spread)
            times[("other", M)] = (other_us * M, other_spread)
        times[("auto_one", 1024)] = times[("other", 1024)] = (1e6, 0.5)
        out.append(Timed(SimpleNamespace(key=key, layers=layers), times))
    return out


@pytest.mark.parametrize("auto_spread, other_spread", [(0.001, 0.002), (0.04, 0.01), (0.005, 0.06)])
@pytest.mark.parametrize("gain_over_noise, picked", [(0.5, "auto_one"), (0.9, "auto_one"), (1.1, "other"),
                                                     (3.0, "other")])
def test_auto_stays_unless_beaten_beyond_both_timings_noise(auto_spread, other_spread, gain_over_noise, picked):
    margin = noise(auto_spread, other_spread)
    assert margin == max(MIN_EFFECT, auto_spread, other_spread)
    choice = server_choice(TwoBackends(), None, tuners(10.0 * (1 + gain_over_noise * margin), 10.0,
                                                       auto_spread, other_spread), "decode")
    assert choice.backend == picked
    assert choice.totals["auto_one"] / choice.totals["other"] == pytest.approx(1 + gain_over_noise * margin)
    if picked == "auto_one":
        assert choice.within_noise == "other" and choice.gain_vs_auto == 1.0
        assert choice.auto_line.endswith("| picked auto_one (other "
                                         f"{1 + gain_over_noise * margin:.3f}x faster, within noise)")
    else:
        assert choice.within_noise is None and choice.gain_vs_auto == pytest.approx(1 + gain_over_noise * margin)


def test_a_slower_other_backend_never_displaces_auto_and_a_tie_keeps_it():
    for other_us in (10.0, 12.0):
        choice = server_choice(TwoBackends(), None, tuners(10.0, other_us, 0.001, 0.001), "decode")
        assert choice.backend == "auto_one" and choice.within_noise is None


def test_the_server_total_weighs_each_problem_by_its_layers_over_the_mix_and_the_per_m_best_beside_it():
    times = {("auto_one", 1): (10.0, 0.0), ("auto_one", 64): (100.0, 0.0), ("auto_one", 1024): (1000.0, 0.0),
             ("other", 1): (12.0, 0.0), ("other", 64): (90.0, 0.0), ("other", 1024): (900.0, 0.0)}
    one = [Timed(SimpleNamespace(key="p", layers=2), times, Ms=[1, 64, 1024])]
    decode = server_choice(TwoBackends(), None, one)              # the decode mix unless told: M <= 64
    assert decode.mix == "decode" and decode.totals == {"auto_one": 220.0, "other": 204.0}
    assert decode.backend == "other" and decode.per_m_total == 200.0 and decode.per_m_gain == pytest.approx(1.02)
    prefill = server_choice(TwoBackends(), None, one, "prefill")
    assert prefill.totals == {"auto_one": 2000.0, "other": 1800.0} and prefill.per_m_total == 1800.0
    # a problem without a layer count weighs one
    plain = server_choice(TwoBackends(), None, [Timed(SimpleNamespace(key="p"), times, Ms=[1, 64, 1024])])
    assert plain.totals == {"auto_one": 110.0, "other": 102.0} and plain.per_m_total == 100.0
    # no batch size of the mix measured, or none correct: two different things to say
    assert server_choice(TwoBackends(), None, [Timed(SimpleNamespace(key="p"), times, Ms=[1024])]).summary == \
        "no batch size of it measured"
    assert server_choice(TwoBackends(), None, [Timed(SimpleNamespace(key="p"), {}, Ms=[1])]).summary == "none eligible"


def test_a_gain_of_exactly_the_noise_keeps_auto():
    times = {("auto_one", 1): (101.0, 0.0), ("other", 1): (100.0, 0.0)}        # 100 x (1 + 1%) = 101
    choice = server_choice(TwoBackends(), None, [Timed(SimpleNamespace(key="p"), times, Ms=[1])])
    assert choice.backend == "auto_one" and choice.within_noise == "other"


def test_why_a_backend_never_ran_is_kept_and_unexpected_failures_are_said_once():
    @dataclass
    class Skipping(Timed):
        def skipped_here(self):
            return {"other": "not in the replay cache"}
    choice = server_choice(TwoBackends(), None, [Skipping(SimpleNamespace(key="p"), {("auto_one", 1): (5.0, 0.0)},
                                                          Ms=[1])])
    assert choice.skipped == {"other": "not in the replay cache"} and choice.backend == "auto_one"
    bad = SimpleNamespace(status="wrong_result", M=1, reason="off")
    for failed, word in ((["x"], "it"), (["x", "y"], "them")):
        c = ServerChoice("f", "decode", None, {}, None, None, {b: bad for b in failed}, {})
        assert c.surprises() == [f"failed though nothing declared expects {word} to (evidence above): {', '.join(failed)}"]
    assert ServerChoice("f", "decode", None, {}, None, None, {}, {})._flag(None) == "-"
