"""The quick tier catches a loosened check: each mutation an audit planted by hand (a correctness check
10x looser or tighter, a family's tolerance 10x off, the NaN poison removed, the keep-faster or
within-noise rule inverted, a tie no longer going to the baseline) is planted in a copy of the tree,
and every quick test named as its catcher must fail there, each on its own (a rule pinned by two
tests has two catchers). The same tests pass on the unmutated copy.

mutmut's score over the same modules (scripts/mutation.py, .ci/run) says how much of the rest is
pinned; this file keeps the few that matter most from ever depending on one test again."""
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TREE = ("pyproject.toml", "autotune", "tests", "search_spaces", "benchmarks/data", "tuned_configs")

CORRECTNESS = ["tests/measure/test_correctness_check.py::test_check_output_passes_just_inside_and_fails_just_outside",
               "tests/measure/test_correctness_check.py::test_a_trial_passes_just_inside_its_tolerance_and_fails_just_outside"]
PINNED = ["tests/measure/test_correctness_check.py::test_every_family_and_dtype_has_its_pinned_tolerance",
          "tests/measure/test_correctness_check.py::test_a_trial_passes_just_inside_the_pinned_tolerance_and_fails_just_outside"]
KEEP_FASTER = ["tests/families/triton_moe/test_sglang_files.py::test_export_keeps_a_better_existing_entry",
               "tests/search/test_keep_rules.py::test_a_rerun_keeps_the_faster_existing_entries_and_replaces_the_slower"]
WITHIN_NOISE = ["tests/search/test_keep_rules.py::test_auto_stays_unless_beaten_beyond_both_timings_noise",
                "tests/search/test_sieve_h200_replay.py::test_the_h200_sieve_replayed_keeps_auto_inside_noise"]

# name: (file, what is there, what is planted instead, the quick tests that must each fail)
PLANTED = {
    "check 10x looser": ("autotune/measure/timing.py", "if not err <= tol:", "if not err <= 10 * tol:", CORRECTNESS),
    "check 10x tighter": ("autotune/measure/timing.py", "if not err <= tol:", "if not err <= tol / 10:", CORRECTNESS),
    "bf16 Triton tolerance 10x looser": ("autotune/families/triton_moe/__init__.py", '"bf16": 1e-2,', '"bf16": 1e-1,',
                                         PINNED),
    "bf16 MoE runners' tolerance 10x tighter": ("autotune/families/moe_backends/__init__.py",
                                                '"moe_bf16", "bf16", 10\n    tol = 0.02\n',
                                                '"moe_bf16", "bf16", 10\n    tol = 0.002\n', PINNED),
    "no NaN poison": ("autotune/measure/measurer.py", 'inputs.C.fill_(float("nan"))', "pass",
                      ["tests/measure/test_correctness_check.py::test_an_output_the_launch_did_not_write_fails_though_its_"
                       "buffer_held_a_right_answer",
                       "tests/measure/test_correctness_check.py::test_a_triton_launch_that_writes_nothing_fails_after_a_right_"
                       "one_filled_its_buffer"]),
    "keep-faster inverted": ("autotune/families/triton_moe/export.py", 'old["tuned_us"] < round(new.total_us, 3)',
                             'old["tuned_us"] > round(new.total_us, 3)', KEEP_FASTER),
    "within-noise inverted": ("autotune/search/server_choice.py", "if eligible[best] * (1 + noise(*spreads)) >= eligible[auto]:",
                              "if eligible[best] * (1 + noise(*spreads)) < eligible[auto]:", WITHIN_NOISE),
    "within-noise dropped": ("autotune/search/server_choice.py", "(1 + noise(*spreads))", "1", WITHIN_NOISE),
    "a tie to the tuned config": ("autotune/search/finalists.py", "s.finalist.source == TUNED", "s.finalist.source != TUNED",
                                  ["tests/search/test_selection.py::test_the_fastest_correct_finalist_wins_and_a_tie_goes_to_"
                                   "the_baseline"]),
    # The eleven an independent audit planted that no test caught (issue 44): each now has its catcher.
    "out of memory before the launch stored as a compile error": (
        "autotune/measure/measurer.py", "            return failed(status, failure_reason(stage, e)), fatal\n",
        "            return failed(records.COMPILE_ERROR, failure_reason(stage, e)), fatal\n",
        ["tests/measure/test_resource_failures.py::test_out_of_memory_before_the_launch_is_the_machines_failure_never_the_configs"]),
    "the memory cap used where less is free": (
        "autotune/gpus/memory_plan.py", "return min(self.free, self.cap) if self.cap else self.free",
        "return self.cap if self.cap else self.free",
        ["tests/gpus/test_gpu_memory.py::test_a_cap_above_the_free_memory_plans_for_what_is_free"]),
    "limits() not less the CUDA context": (
        "autotune/gpus/memory_plan.py", "self.share(i, phase, self.workers[phase.name][i]) - CONTEXT_BYTES",
        "self.share(i, phase, self.workers[phase.name][i])",
        ["tests/gpus/test_gpu_memory.py::test_every_workers_limit_and_its_cuda_context_together_fit_its_gpu"]),
    "a later phase brings back workers a shortage removed": (
        "autotune/measure/pool.py", "want = max(1, plan.workers[name][i] - self._cut.get(g.index, 0))",
        "want = max(1, plan.workers[name][i])",
        ["tests/measure/test_resource_failures.py::test_out_of_memory_is_measured_again_and_never_returned"]),
    "the layer check judges bf16 at FP8's tolerance": (
        "autotune/families/triton_moe/layer_timing.py", 'return (MoeBf16 if dtype == "bf16" else MoeFp8).tol',
        "return MoeFp8.tol",
        ["tests/families/triton_moe/test_confirm.py::test_on_a_gpu_the_layer_check_holds_each_dtype_to_its_own_tolerance"]),
    "the layer check's minimum over repeats": (
        "autotune/families/triton_moe/layer_timing.py", "med = statistics.median(ts)", "med = min(ts)",
        ["tests/families/triton_moe/test_confirm.py::test_a_sides_layer_time_is_the_median_of_its_repeats_and_its_spread_their_range"]),
    "a NaN error passes the check": (
        "autotune/measure/timing.py", "if not err <= tol:", "if err > tol:",
        ["tests/measure/test_correctness_check.py::test_a_reference_with_nan_or_inf_fails_every_output"]),
    "publish keeps another GPU's entry as faster": (
        "autotune/publish/__init__.py", 'return a.get("device") == b.get("device") and all(', "return all(",
        ["tests/publish/test_publish.py::test_the_serving_repos_entry_of_another_gpu_or_stack_is_never_kept_as_faster"]),
    "publish's proof misses a file beyond the plan": (
        "autotune/publish/serving_repo.py", "extra = [p for p in changed if p not in planned]", "extra = []",
        ["tests/publish/test_publish.py::test_a_commit_that_is_not_the_plan_is_refused_and_the_repo_put_back[hook-adds-a-file]"]),
    "immutable=true not read-only": (
        "autotune/store/storage_url.py", 'immutable = "immutable" in params and sqlite_immutable(params["immutable"])',
        'immutable = params.get("immutable") == "1"',
        ["tests/store/test_storage_url.py::test_immutable_is_read_only_exactly_where_sqlite_reads_it_as_true"]),
    "export's keep rule blind to the Triton version": (
        "autotune/families/triton_moe/export.py",
        '                  and old_entry.get("triton") == device.versions.get("triton"))', ")",
        ["tests/families/triton_moe/test_sglang_files.py::test_an_entry_timed_under_another_triton_is_never_kept_as_faster"]),
}


def copy_tree(dest: Path) -> Path:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache", ".hypothesis", "replay")
    for name in TREE:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=ignore)
        else:
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


# A catcher failing for want of something the copy lacks (a file, a module) is no catch: it would fail on
# the unmutated copy too.
NOT_A_CATCH = ("FileNotFoundError", "No such file or directory", "ModuleNotFoundError", "ImportError")


def quick_tests(tree: Path, tests: list[str]) -> dict[str, bool]:
    """Run `tests` (node ids, or their prefixes) in `tree` with the quick tier's selection; per id, whether
    every test it names passed. The copy's autotune is the one imported, in the tests and in the
    processes they start. A test that errs (in its setup) or fails for want of a file or a module of
    the copy fails this."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    report = tree / "report.xml"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "not slow", "-p", "no:cacheprovider",
                           "-p", "no:xdist", f"--junitxml={report}", *tests], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode in (0, 1), proc.stdout[-3000:] + proc.stderr[-3000:]   # not: no tests, errors
    outcomes = {}
    for case in ET.parse(report).iter("testcase"):
        node = case.get("classname").replace(".", "/") + ".py::" + case.get("name")
        bad = [child for child in case if child.tag in ("failure", "error")]
        assert not [b for b in bad if b.tag == "error" or any(w in (b.get("message") or "") + (b.text or "")[-2000:]
                                                               for w in NOT_A_CATCH)], (node, bad[0].get("message"))
        outcomes[node] = not bad
    ran = {t: [ok for node, ok in outcomes.items() if node == t or node.startswith(t + "[")] for t in tests}
    assert all(ran.values()), f"not collected in the quick tier: {[t for t, oks in ran.items() if not oks]}"
    return {t: all(oks) for t, oks in ran.items()}


@pytest.mark.slow
def test_the_copy_imports_its_own_autotune(tmp_path):
    tree = copy_tree(tmp_path / "tree")
    out = subprocess.run([sys.executable, "-c", "import autotune.measure.timing as m; print(m.__file__)"], cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True, text=True, check=True)
    assert Path(out.stdout.strip()).resolve() == (tree / "autotune/measure/timing.py").resolve()


@pytest.mark.slow
def test_every_catcher_is_in_the_copy_and_the_cheap_ones_pass_there(tmp_path):
    """The quick tier runs every catcher green on the tree itself (.ci/run runs it first). Here: the copy
    holds every catcher, and the cheap ones (unit tests, no whole run, pool or replayed sieve) pass in it;
    a catcher's failure on a mutated copy is held to an assertion, never a file or module the copy lacks
    (quick_tests). Running every catcher again on the unmutated copy was 259 s of the slow tier."""
    tree = copy_tree(tmp_path / "tree")
    catchers = sorted({t for *_, tests in PLANTED.values() for t in tests})
    env = {**os.environ, "PYTHONPATH": str(tree)}
    listed = subprocess.run([sys.executable, "-m", "pytest", "-q", "--collect-only", "-m", "not slow", "-p",
                             "no:cacheprovider", "-p", "no:xdist", *catchers], cwd=tree, env=env, capture_output=True,
                            text=True, timeout=600)
    assert listed.returncode == 0, listed.stdout[-3000:]
    cheap = [t for t in catchers if "triton" not in t and t.split("::")[0] in (
        "tests/measure/test_correctness_check.py", "tests/gpus/test_gpu_memory.py", "tests/search/test_selection.py", "tests/store/test_storage_url.py")]
    assert len(cheap) >= 6 and quick_tests(tree, cheap) == {t: True for t in cheap}


@pytest.mark.slow      # a pytest process per planted mutation, on a copy of the tree
@pytest.mark.parametrize("name", PLANTED)
def test_the_quick_tier_catches_the_planted_mutation(tmp_path, name):
    path, was, planted, catchers = PLANTED[name]
    tree = copy_tree(tmp_path / "tree")
    text = (tree / path).read_text()
    assert text.count(was) == 1, f"{path} no longer holds {was!r}: plant the mutation where the check is now"
    (tree / path).write_text(text.replace(was, planted))
    assert quick_tests(tree, catchers) == {t: False for t in catchers}


def _runner():
    import importlib.util

    spec = importlib.util.spec_from_file_location("mutation_runner", ROOT / "scripts/mutation.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_runner_scores_the_mutants_it_ran_by_mutmuts_own_exit_codes(tmp_path):
    """scripts/mutation.py's account of a run: mutmut's meta files, its exit codes named as mutmut names
    them, only the mutants asked for, and the score over those some quick test reached."""
    import json

    runner = _runner()
    meta = tmp_path / "mutants/autotune/search/sieve.py.meta"
    meta.parent.mkdir(parents=True)
    codes = {"autotune.search.sieve.x_pins_over_default__mutmut_1": 1, "autotune.search.sieve.x_pins_over_default__mutmut_2": 0,
             "autotune.search.sieve.xǁBackendTunerǁselect__mutmut_1": 1, "autotune.search.sieve.xǁBackendTunerǁselect__mutmut_2": 36,
             "autotune.search.sieve.xǁBackendTunerǁmeasure__mutmut_1": 0,          # not asked for: not counted
             "autotune.search.sieve.x_tactic_id__mutmut_1": 33}
    meta.write_text(json.dumps({"exit_code_by_key": codes}))
    (tmp_path / "mutants/autotune/measure").mkdir()
    (tmp_path / "mutants/autotune/measure/timing.py.meta").write_text(json.dumps({"exit_code_by_key": {
        "autotune.measure.timing.x_time_gpu__mutmut_1": 33, "autotune.measure.timing.x_check_output__mutmut_1": None}}))
    res = runner.results(tmp_path)
    assert res["autotune/search/sieve.py"] == {"autotune.search.sieve.x_pins_over_default__mutmut_1": "killed",
                                         "autotune.search.sieve.x_pins_over_default__mutmut_2": "survived",
                                         "autotune.search.sieve.xǁBackendTunerǁselect__mutmut_1": "killed",
                                         "autotune.search.sieve.xǁBackendTunerǁselect__mutmut_2": "timeout"}
    assert runner.results(tmp_path, ("autotune.search.sieve.*",)).keys() == {"autotune/search/sieve.py"}   # as --only asks
    r = runner.report(res, finished=False, seconds=12.4)
    assert r["score"] == 2 / 4 and r["total"] == {"killed": 2, "survived": 1, "timeout": 1, "no tests": 1,
                                                   "not checked": 1}
    assert r["survivors"] == ["autotune.search.sieve.x_pins_over_default__mutmut_2",
                              "autotune.search.sieve.xǁBackendTunerǁselect__mutmut_2"]
    assert runner.score(["no tests", "not checked"]) is None


def test_only_narrows_the_run_to_the_mutant_patterns_it_matches():
    """`--only`: one module's mutants run without every other's; a pattern matching nothing runs none
    (main refuses it in one line) rather than all."""
    runner = _runner()
    assert runner.chosen(None) == runner.MUTANTS
    assert runner.chosen(["autotune.folder.change*"]) == ("autotune.folder.change.*",)
    sieve = runner.chosen(["autotune.search.sieve.*"])
    assert "autotune.search.sieve.x_pins_over_default_*" in sieve and "autotune.measure.timing.*" not in sieve
    assert runner.chosen(["autotune.families.triton_moe.pairs.*", "autotune.measure.timing.*"]) == \
        ("autotune.measure.timing.*", "autotune.families.triton_moe.pairs.*")
    assert runner.chosen(["autotune.nothing*"]) == ()



def test_since_runs_the_modules_a_change_touched_and_the_core(tmp_path):
    """`--since REV` (.ci/run): the MUTANTS entries of every module changed since REV (committed after it,
    changed in the working tree, or new), and CORE whatever changed; every entry names a module that exists."""
    runner = _runner()
    assert all((ROOT / runner.module_of(m)).is_file() for m in runner.MUTANTS)
    assert runner.module_of("autotune.search.sieve.xǁBackendTunerǁselect_*") == "autotune/search/sieve.py"
    assert runner.touched({"README.md", "tests/test_api.py"}) == runner.CORE
    sieve = runner.touched({"autotune/search/sieve.py"})
    assert set(sieve) - set(runner.CORE) == {m for m in runner.MUTANTS if m.startswith("autotune.search.sieve.")}
    assert set(runner.touched(set(runner.module_of(m) for m in runner.MUTANTS))) == set(runner.MUTANTS)

    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                       capture_output=True)
    git("init", "-q")
    for name in ("a.py", "b.py", "c.py"):
        (tmp_path / name).write_text("x = 1\n")
    git("add", ".")
    git("commit", "-q", "-m", "base")
    base = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    (tmp_path / "a.py").write_text("x = 2\n")
    git("commit", "-q", "-am", "after")
    (tmp_path / "b.py").write_text("x = 3\n")            # changed, not committed
    (tmp_path / "d.py").write_text("x = 4\n")            # new
    assert runner.changed_files(base, tmp_path) == {"a.py", "b.py", "d.py"}
