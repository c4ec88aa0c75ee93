"""SGLang 0.5.16's own runs on the H200 (a committed sample of their logs and results): which config
each arm loaded, per the lines SGLang printed, and the gate on those numbers."""
import json
import shutil
from pathlib import Path

import pytest
from hypothesis import example, given, settings, strategies as st

from autotune.cli import main
from autotune.validate.server_arms import INSTANCE_SPREAD, comparisons, evidence, instance_spread, read_runs, table

SAMPLE = Path(__file__).parents[1] / "data/validate/sglang016_runs"
TUNED = "tuned_configs/sglang-0.5.16/NVIDIA_H200"


def test_each_arm_is_what_sglang_says_it_loaded():
    runs, problems = read_runs(SAMPLE, TUNED)
    assert problems == []
    by = {(r.mode, r.arm): r for r in runs}
    tuned = by["one_batch", "tuned"].evidence
    assert len(tuned.files) == 2 and all(f"{TUNED}/configs/triton_3_6_0/" in f for f in tuned.files)
    assert any(f.endswith("_down.json") for f in tuned.files) and not tuned.defaults
    default = by["one_batch", "default"].evidence
    assert not default.files and len(default.defaults) == 2
    shipped = by["one_batch", "shipped"].evidence     # 0.5.16 on triton 3.6.0: its triton 3.5.1 file, no _down
    assert shipped.files == [f for f in shipped.files if "/sglang/" in f and "triton_3_5_1" in f] and shipped.files
    assert shipped.down_reused and not shipped.defaults
    assert by["server", "tuned"].evidence.files == tuned.files


def test_results_are_sglangs_step_times():
    runs, _ = read_runs(SAMPLE, TUNED)
    rows = {(r["mode"], r["batch"]): r for r in table(runs)}
    raw = [json.loads(x) for x in (SAMPLE / "one_batch_bf16_r1_tuned.jsonl").read_text().splitlines()]
    for row in raw:
        got = rows["one_batch", row["batch_size"]]["tuned"]
        assert abs(got["ms_per_step"] - 1000 * row["median_decode_latency"]) < 1e-9
        assert abs(got["tok_s"] - row["batch_size"] / row["median_decode_latency"]) < 1e-6
    assert sorted(b for m, b in rows if m == "one_batch") == [1, 8, 32, 64, 128, 256]


def test_a_tuned_run_that_loaded_other_files_is_refused(tmp_path, capsys):
    runs = tmp_path / "runs"
    shutil.copytree(SAMPLE, runs)
    log = runs / "one_batch_bf16_r1_tuned.log"
    log.write_text(log.read_text().replace(TUNED, "elsewhere/NVIDIA_H200"))
    got, problems = read_runs(runs, TUNED)
    assert any(p.startswith("one_batch_bf16_r1_tuned:") and "did not load the tuned folder" in p for p in problems)
    assert not any(r.name == "one_batch_bf16_r1_tuned" for r in got)
    folder = tmp_path / "folder"
    shutil.copytree(Path(__file__).resolve().parents[2] / TUNED, folder / TUNED)
    before = (folder / TUNED / "validation.json").read_bytes()
    # --force: even where the validation there may be replaced, runs that contradict their arm write nothing
    rc = main(["validate", "--engine", "sglang", "--from-runs", str(runs), "--configs", str(folder / TUNED), "--force"])
    assert rc == 2 and "did not load the tuned folder" in capsys.readouterr().err
    assert (folder / TUNED / "validation.json").read_bytes() == before


def test_default_arm_that_found_a_file_is_refused():
    ev = evidence("[2026-12-02 04:16:50 TP0] Using MoE kernel config from /x/configs/triton_3_6_0/E=1,N=2,device_name=X.json.")
    from autotune.validate.server_arms import check_arm
    assert check_arm("default", ev, None) and check_arm("tuned", ev, "a/b") and check_arm("shipped", ev, None) is None


ROOT = Path(__file__).resolve().parents[2]
RUNS_023 = ROOT / "benchmarks/data/h200_sglang023_arms_2026-12-02.tgz"
RUNS_016 = [ROOT / "benchmarks/data" / f"h200_sglang016_arms{s}_2026-12-02.tgz" for s in ("", "_fp8_block", "_fp8_block_server")]


def _judged_as_committed(out: Path, committed: Path) -> dict:
    """The fresh judgement equals what the committed validation.json carries, point by point."""
    rec = json.loads((out / "validation.json").read_text())
    old = json.loads(committed.read_text())
    key = ("point", "baseline", "tuned", "ratio", "sigma", "threshold", "verdict", "noise", "against")
    assert [{k: c[k] for k in key} for c in rec["comparisons"]] == [{k: c[k] for k in key} for c in old["comparisons"]]
    assert rec["gate"] == old["gate"]
    return rec


def test_gate_on_the_recorded_h200_runs(tmp_path, capsys):
    """SGLang 0.5.16's committed runs: the default arm of the server had one start (its second was cut
    short), so those 12 points are not judged; the old gate called all 12 a gain against a 1% floor."""
    out = tmp_path / "out"
    configs = ROOT / TUNED
    argv = ["validate", "--engine", "sglang", *[a for r in RUNS_016 for a in ("--from-runs", str(r))],
            "--configs", str(configs), "--out", str(out), "--gate"]
    assert main(argv) == 0
    rec = _judged_as_committed(out, configs / "validation.json")
    assert rec["engine"] == "sglang-server 0.5.16" and rec["gate"]["passed"]
    assert rec["device"]["gpu"] == "NVIDIA H200" and rec["device"]["sglang"] == "0.5.16"
    arms = {(r["mode"], r["arm"]) for r in rec["runs"]}
    assert arms == {(m, a) for m in ("one_batch", "server") for a in ("default", "shipped", "tuned")}
    one_run = [c for c in rec["comparisons"] if min(len(c["baseline"]), len(c["tuned"])) < 2]
    assert len(one_run) == 12 and {c["point"].split(",")[0] for c in one_run} == {
        "server bf16 vs default", "server fp8_block vs default"}
    assert all(c["verdict"] == "not judged" and "borrowed" in c["noise"] for c in one_run)
    assert not any(c["verdict"] == "gain" for c in one_run)
    assert rec["gate"]["counts"]["default"] == {"points": 24, "gain": 10, "within noise": 2, "regression": 0,
                                                "not judged": 12}


def test_the_known_instance_spread_is_what_the_committed_runs_say(tmp_path):
    """INSTANCE_SPREAD, which a one-run arm borrows, recomputed from the committed H200 runs of
    SGLang 0.5.16 and 0.5.23 (one run set per release)."""
    import tarfile

    sets = []
    for release, tgzs, folder in (("0.5.16", RUNS_016, TUNED), ("0.5.23", [RUNS_023], "tuned_configs/NVIDIA_H200")):
        runs = []
        for i, tgz in enumerate(tgzs):
            with tarfile.open(tgz) as t:
                t.extractall(tmp_path / release / str(i), filter="data")
            [inner] = [d for d in (tmp_path / release / str(i)).iterdir() if d.is_dir()]
            runs += read_runs(inner, folder)[0]
        sets.append(runs)
    for mode, groups in (("one_batch", 54), ("server", 18)):
        sigma, n = instance_spread(sets, mode)
        assert n == groups and INSTANCE_SPREAD[mode].sigma == pytest.approx(sigma, abs=0.0005), (mode, sigma)
        assert f"{groups} (release, dtype, arm, batch) groups" in INSTANCE_SPREAD[mode].source


def _scaled(src: Path, dst: Path, factor: float) -> None:
    rows = [json.loads(x) for x in src.read_text().splitlines()]
    dst.write_text("\n".join(json.dumps({**r, "median_decode_latency": r["median_decode_latency"] * factor}) for r in rows))


def test_the_gate_fails_when_tuned_is_slower_beyond_noise(tmp_path):
    """Tuned 30% slower in both of two repeats: a regression at every batch, and the gate fails. With
    the one repeat of the committed sample the same slowdown is not judged (one start per arm)."""
    from autotune.validate.gate import gate

    runs = tmp_path / "runs"
    shutil.copytree(SAMPLE, runs)
    _scaled(SAMPLE / "one_batch_bf16_r1_tuned.jsonl", runs / "one_batch_bf16_r1_tuned.jsonl", 1.3)
    got, _ = read_runs(runs, TUNED)
    cs = [c for c in comparisons(got, "shipped") if c.extra["mode"] == "one_batch"]
    assert len(cs) == 6 and all(c.verdict == "not judged" for c in cs)
    for arm, factor in (("shipped", 1.01), ("tuned", 1.3 * 0.99)):          # a second repeat, a little scatter
        shutil.copy(runs / f"one_batch_bf16_r1_{arm}.log", runs / f"one_batch_bf16_r2_{arm}.log")
        _scaled(SAMPLE / f"one_batch_bf16_r1_{arm}.jsonl", runs / f"one_batch_bf16_r2_{arm}.jsonl", factor)
    got, _ = read_runs(runs, TUNED)
    cs = [c for c in comparisons(got, "shipped") if c.extra["mode"] == "one_batch"]
    assert len(cs) == 6 and all(c.verdict == "regression" and c.paired for c in cs)
    g = gate(cs)
    assert not g.passed and g.lines[-1] == "gate FAILED: tuned is slower than baseline beyond noise at 6 of 6 judged points"


FP8_RUNS = Path(__file__).resolve().parents[2] / "benchmarks/data/h200_sglang016_arms_fp8_block_2026-12-02.tgz"


def test_block_fp8_arms_read_from_sglangs_own_lines(tmp_path):
    """Block-FP8 file names hold a space ("block_shape=[128, 128]"): the whole path is the evidence.
    SGLang 0.5.16 ships no H200 file for E=512, N=128 block-FP8, so its shipped arm is its default,
    which the shipped arm accepts (and records) rather than refusing."""
    import tarfile

    with tarfile.open(FP8_RUNS) as t:
        t.extractall(tmp_path)
    runs, problems = read_runs(tmp_path / "arms_runs", TUNED)
    assert problems == [] and len(runs) == 9
    name = "E=512,N=128,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128]"
    for r in runs:
        if r.arm == "tuned":
            assert sorted(r.evidence.files) == [f"/work/main/{TUNED}/configs/triton_3_6_0/{name}{s}.json"
                                                for s in ("", "_down")]
        else:
            assert not r.evidence.files and all(name in d for d in r.evidence.defaults)
            assert len(r.evidence.defaults) == 2
    shipped = [r for r in runs if r.arm == "shipped"][0].evidence
    assert all("/sglang/srt/layers/moe/" in d for d in shipped.defaults)     # SGLang's own folder had none


def test_a_shipped_arm_with_neither_file_nor_default_is_refused():
    from autotune.validate.server_arms import check_arm
    assert check_arm("shipped", evidence("no config lines at all"), None) == "SGLang loaded no MoE config file"




def test_sglang_0523_runs_on_the_h200_judge_the_committed_folder(tmp_path):
    """SGLang 0.5.23 itself (sglang.benchmark.one_batch) on the H200 with tuned_configs/NVIDIA_H200: every
    tuned run loaded that folder's up and _down files, 0.5.23's shipped arm fell back to its triton 3.5.1
    file, and the record says which SGLang ran and which module measured."""
    out = tmp_path / "out"
    configs = Path(__file__).resolve().parents[2] / "tuned_configs/NVIDIA_H200"
    assert main(["validate", "--engine", "sglang", "--from-runs", str(RUNS_023), "--configs", str(configs),
                 "--out", str(out), "--gate"]) == 0
    rec = _judged_as_committed(out, configs / "validation.json")
    assert rec["gate"]["lines"][:2] == ["tuned vs shipped: faster beyond noise at 4 of 6 points, within noise at 2",
                                        "tuned vs default: faster beyond noise at 5 of 6 points, within noise at 1"]
    assert rec["engine"] == "sglang-server 0.5.23" and rec["device"]["sglang"] == "0.5.23"
    tuned = [r for r in rec["runs"] if r["arm"] == "tuned"]
    assert len(tuned) == 3 and all(
        sorted(Path(f).name for f in r["evidence"]["files"]) ==
        ["E=512,N=128,device_name=NVIDIA_H200.json", "E=512,N=128,device_name=NVIDIA_H200_down.json"]
        and all("tuned_configs/NVIDIA_H200/configs/triton_3_6_0/" in f for f in r["evidence"]["files"]) for r in tuned)
    shipped = [r for r in rec["runs"] if r["arm"] == "shipped"]
    assert shipped and all("triton_3_5_1" in f for r in shipped for f in r["evidence"]["files"])
    report = (out / "report.md").read_text()
    assert "python -m sglang.benchmark.one_batch" in report and "sglang.bench_one_batch`" not in report


def test_runs_with_one_start_per_arm_fail_the_gate_as_not_judged(tmp_path, capsys):
    """The committed sample holds one run per arm: nothing can be judged, so --gate exits 1 and says so."""
    out = tmp_path / "out"
    argv = ["validate", "--engine", "sglang", "--from-runs", str(SAMPLE), "--configs", str(ROOT / TUNED),
            "--out", str(out)]
    assert main(argv + ["--gate"]) == 1
    assert "gate FAILED: none of 12 tested points could be judged (each needs at least 2 runs per side)" in \
        capsys.readouterr().out
    rec = json.loads((out / "validation.json").read_text())
    assert not rec["gate"]["passed"] and {c["verdict"] for c in rec["comparisons"]} == {"not judged"}


# --- --from-runs replaces only a validation of the same runs; report.md travels --------------------

VALIDATE_FILES = ("validation.json", "report.md", "validation.png")


def _copy_committed(tmp_path, folder=TUNED) -> Path:
    dst = tmp_path / folder
    shutil.copytree(ROOT / folder, dst)
    return dst


def test_the_readmes_from_runs_command_does_not_replace_a_validation_of_other_runs(tmp_path, capsys, monkeypatch):
    """README's `validate --from-runs ARCHIVE --configs tuned_configs/sglang-0.5.16/NVIDIA_H200 --gate` with
    one of the three archives rewrote the committed validation.json (its block-FP8 rows gone), report.md
    and validation.png, exit 0. Refused in one line, before any run is read; --force replaces them."""
    configs = _copy_committed(tmp_path)
    before = {n: (configs / n).read_bytes() for n in VALIDATE_FILES}
    monkeypatch.chdir(tmp_path)
    argv = ["validate", "--engine", "sglang", "--from-runs", str(RUNS_016[0]), "--configs", TUNED, "--gate"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "was made from other runs (h200_sglang016_arms_2026-12-02.tgz, " in err[0], err
    assert "--from-runs replaces only a validation of the same runs" in err[0] and "--force" in err[0]
    assert {n: (configs / n).read_bytes() for n in VALIDATE_FILES} == before
    assert main(argv + ["--force"]) == 0
    rec = json.loads((configs / "validation.json").read_text())
    assert rec["settings"]["runs"] == [str(RUNS_016[0])] and len(rec["comparisons"]) == 24


def test_a_validation_of_the_same_runs_is_made_again_with_the_same_judgement(tmp_path, capsys, monkeypatch):
    """The command that made the committed validation, run again into its folder: the same runs, so it
    may replace it, and every judged number is what the committed record holds."""
    configs = _copy_committed(tmp_path)
    committed = tmp_path / "committed.json"
    shutil.copy(configs / "validation.json", committed)
    monkeypatch.chdir(tmp_path)
    argv = ["validate", "--engine", "sglang", *[a for r in RUNS_016 for a in ("--from-runs", str(r))],
            "--configs", TUNED, "--gate"]
    assert main(argv) == 0, capsys.readouterr().err
    rec = _judged_as_committed(configs, committed)
    assert rec["judged"] == json.loads(committed.read_text())["judged"]


def test_validation_records_the_bytes_it_judged_and_how_they_were_measured():
    """Each committed validation names the sha256 of every file of its folder, and the folder is still
    those bytes; the SGLang 0.5.16 folder's configs were chosen by a replay, the 0.5.23 one's on the H200."""
    from autotune.validate.judged import folder_sha256, tree_sha256

    for folder, kind, runs in ((TUNED, "replay", RUNS_016), ("tuned_configs/NVIDIA_H200", "gpu", [RUNS_023])):
        rec = json.loads((ROOT / folder / "validation.json").read_text())
        assert rec["judged"]["sha256"] == folder_sha256(ROOT / folder), folder
        assert rec["judged"]["measured_on"] == kind and rec["judged"]["validated_on"] == "gpu"
        assert rec["settings"]["runs_sha256"] == [tree_sha256(r) for r in runs]
        assert "configs/triton_3_6_0/E=512,N=128,device_name=NVIDIA_H200.json" in rec["judged"]["sha256"]


# An absolute path where report.md could hold one: after a space, a quote, a bracket, '=' or 'file:///'
ABSOLUTE = __import__("re").compile(r"(?:^|(?<=[\s`'\"(\[=])|(?<=:///))/[\w.~-]")


def test_report_md_holds_no_absolute_path(tmp_path, capsys):
    """Given absolute paths, and quoting SGLang's log lines of another machine, report.md still names no
    absolute path (it travels into the serving repo); validation.json keeps the log lines whole."""
    out = tmp_path / "out"
    assert main(["validate", "--engine", "sglang", "--from-runs", str(RUNS_023), "--configs",
                 str(ROOT / "tuned_configs/NVIDIA_H200"), "--out", str(out), "--gate"]) == 0
    report = (out / "report.md").read_text()
    assert ABSOLUTE.findall(report) == [] and str(tmp_path) not in report
    link = report.split("From [provenance.json](")[1].split(")")[0]          # relative, and it resolves
    assert (out / link).resolve() == ROOT / "tuned_configs/NVIDIA_H200/provenance.json"
    assert "tuned (`tuned_configs/NVIDIA_H200`)" in report          # the folder as a user in the checkout names it
    assert "…/NVIDIA_H200/configs/triton_3_6_0/E=512,N=128,device_name=NVIDIA_H200.json" in report
    rec = json.loads((out / "validation.json").read_text())
    assert any(line.startswith("[") and "/tuned_configs/NVIDIA_H200/configs/" in line
               for r in rec["runs"] for line in r["evidence"]["lines"])
    for committed in ("tuned_configs/NVIDIA_H200/report.md", f"{TUNED}/report.md"):
        assert ABSOLUTE.findall((ROOT / committed).read_text()) == [], committed


def test_the_committed_validations_publish_as_their_folders_are(tmp_path, capsys):
    """The committed H200 folder (measured on the GPU, validated by SGLang 0.5.23's runs) publishes as it
    is; the SGLang 0.5.16 folder, whose configs a replay chose, is refused whatever its gate says."""
    import subprocess

    repo = tmp_path / "serving"
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q",
                    "--allow-empty", "-m", "init"], check=True)
    assert main(["publish", "--to", str(repo), "--from", str(ROOT / TUNED), "--branch", "t516"]) == 2
    assert "configs were measured by replay, not on a GPU" in capsys.readouterr().err
    assert main(["publish", "--to", str(repo), "--from", str(ROOT / "tuned_configs/NVIDIA_H200")]) == 0, \
        capsys.readouterr().err


@settings(max_examples=300, deadline=None)
@example(["/=/:"])                      # shortened once, its '=/' was a path to shorten again
@example(["/a=/b"])
@given(st.lists(st.one_of(st.text(alphabet="/ab.~-_ `'\"()[]=:…\n", max_size=12),
                          st.sampled_from(["/tmp/x", "sqlite:////tmp/a.db", "https://github.com/a/b", "(/a/b/c/d/e/f)",
                                           "E=1,block_shape=[128, 128].json", "../rel/x", "n/a", "tok/s"])), max_size=8))
def test_portable_leaves_no_absolute_path_and_keeps_what_is_not_one(parts):
    """report.md's one rule for paths: no absolute path survives, a second pass changes nothing, and
    URLs, relative paths and ratios are left as they were."""
    from autotune.validate.report import portable

    text = "".join(parts)
    out, _ = portable(text)
    assert not __import__("re").search(r"(?:^|(?<=[\s`'\"(\[=]))/[\w.~-]", out), (text, out)
    assert portable(out) == (out, False)
    for kept in ("https://github.com/a/b", "../rel/x", "n/a", "tok/s"):
        if text == kept:
            assert out == kept


def test_a_folder_changed_while_it_is_validated_gets_no_validation(tmp_path, capsys, monkeypatch):
    """The judged bytes are read before any run and again before anything is written: a file changed in
    between (a run writing into the folder meanwhile) would be judged half old, half new."""
    import autotune.validate.server_arms as arms

    configs = _copy_committed(tmp_path, "tuned_configs/NVIDIA_H200")
    real = arms.read_runs

    def read_and_touch(folder, tuned):
        (configs / "server_args.yaml").write_text("moe-runner-backend: triton\n")
        return real(folder, tuned)

    monkeypatch.setattr(arms, "read_runs", read_and_touch)
    out = tmp_path / "out"
    assert main(["validate", "--engine", "sglang", "--from-runs", str(RUNS_023), "--configs", str(configs),
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith("server_args.yaml changed): nothing written; validate it again") and len(err) == 1, err
    assert not out.exists()


@pytest.mark.parametrize("failing", [1, 2, 3])
def test_validations_three_files_change_as_one(tmp_path, capsys, monkeypatch, failing):
    """validation.json, validation.png and report.md: where any one cannot be written, none is replaced
    (a new record beside an old report was possible)."""
    import errno
    import hashlib

    from autotune.fileio import writing

    configs = _copy_committed(tmp_path)
    before = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in configs.iterdir() if p.is_file()}
    monkeypatch.chdir(tmp_path)
    real, writes = writing.atomic_file, []

    def failing_write(path):
        if ".validate-staged-" in str(path):
            writes.append(path)
            if len(writes) == failing:
                raise writing.WriteError(f"cannot write {path}: {errno.errorcode[errno.ENOSPC]}")
        return real(path)
    monkeypatch.setattr(writing, "atomic_file", failing_write)
    argv = ["validate", "--engine", "sglang", *[a for r in RUNS_016 for a in ("--from-runs", str(r))],
            "--configs", TUNED, "--gate", "--force"]
    assert main(argv) != 0
    assert {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in configs.iterdir() if p.is_file()} == before
    assert not list(configs.glob(".validate-staged-*"))
