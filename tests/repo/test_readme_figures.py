"""Every measured figure in README.md is what the committed data says.

Each figure is recomputed from the committed file it comes from (the validations' gate, the
FlashInfer cache probes, the fresh-clone timings, the CPU lock, the code's own constants) and must
appear in README as written; then every figure-looking number left in README (a percentage, a size,
a duration, "K of N") fails the test: a new figure has to be tied to data here, or go.
docs/VALIDATE.md quotes the same gate summaries. Docs figures that were once written by hand and
found off (warm start, the sieve's totals, the block-FP8 arms) are recomputed here as well.
"""
import json
import re
import statistics
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks/results"
VALIDATIONS = {"0.5.23": ROOT / "tuned_configs/NVIDIA_H200/validation.json",
               "0.5.16": ROOT / "tuned_configs/sglang-0.5.16/NVIDIA_H200/validation.json"}
# The tactic pins of the H200 FP8 GEMM runs (docs/PERFORMANCE.md, session 12): two runs, each probed
# on its own lease, and the first run's cache probed again, every bucket, on a later lease.
SAME_LEASE = [RESULTS / "h200_flashinfer_cache_probe_7_2026-12-03.json",
              RESULTS / "h200_flashinfer_cache_probe_8_2026-12-03.json"]
LATER_LEASE = RESULTS / "h200_flashinfer_cache_probe_9_2026-12-03.json"
FIGURE = re.compile(r"[+-]?\d[\d.,]*(?:-\d[\d.,]*)?\s?(?:%|GB|GiB|MiB|ms\b|µs\b|min\b|s\b)|\b\d+ (?:and \d+ )?of \d+\b")


def flat(path: Path) -> str:
    """The text with its line breaks and runs of spaces as one space (README wraps sentences)."""
    return " ".join(path.read_text().split())


def _pct_range(xs) -> str:
    lo, hi = f"{100 * min(xs):.1f}", f"{100 * max(xs):.1f}"
    return f"{lo}%" if lo == hi else f"{lo}-{hi}%"


def _apart(a: float, b: float) -> float:
    """How far two timings are apart: the larger over the smaller, less one (either order the same)."""
    return max(a, b) / min(a, b) - 1


def _duration(seconds: float) -> str:
    s = round(seconds)
    return f"{s // 60} min {s % 60:02d} s" if s >= 60 else f"{s} s"


def gate_figures(release: str) -> list[str]:
    """What README says of one validation: its gate's summary per baseline, the runs, the batches."""
    rec = json.loads(VALIDATIONS[release].read_text())
    assert rec["engine"] == f"sglang-server {release}" and rec["gate"]["passed"]
    out = [ln for ln in rec["gate"]["lines"] if ln.startswith("tuned vs ")]
    assert len(out) == 2
    if release == "0.5.23":
        runs = {(r["arm"], r["mode"]) for r in rec["runs"]}
        per_arm = {statistics.mode(sum(1 for r in rec["runs"] if r["arm"] == a) for a, _ in runs)}
        xs = sorted({c["x"] for c in rec["comparisons"]})
        assert {m for _, m in runs} == {"one_batch"} and len(per_arm) == 1
        out.append(f"bench_one_batch at batches {xs[0]} to {xs[-1]}, {per_arm.pop()} runs per arm")
    else:
        bf16 = [c for c in rec["comparisons"] if c["against"] == "shipped" and c["extra"]["dtype"] == "bf16"]
        gains = sum(c["verdict"] == "gain" for c in bf16)
        out.append(f"against its shipped bf16 file tuned is beyond noise at {gains} of {len(bf16)} points")
    return out


def tactic_figures() -> list[str]:
    runs = [json.loads(p.read_text()) for p in SAME_LEASE]
    later = json.loads(LATER_LEASE.read_text())
    pins = [[r for r in rows if r["tactic"] != "-1"] for rows in runs]
    later_pins = [r for r in later if r["tactic"] != "-1"]
    from autotune.measure.timing import MIN_EFFECT
    later_gain = [r["default µs"] / r["pinned µs"] - 1 for r in later_pins]
    below = sum(g < MIN_EFFECT for g in later_gain)
    assert {(r["problem"], r["M"], r["tactic"]) for r in later_pins} == {(r["problem"], r["M"], r["tactic"]) for r in pins[0]}
    return [f"pinned {len(pins[0])} and {len(pins[1])} of {len(later)} buckets",
            f"{_pct_range([r['speedup'] - 1 for p in pins for r in p])} faster than the default in their duels",
            f"{_pct_range([r['default µs'] / r['pinned µs'] - 1 for p in pins for r in p])} in a fresh process on the "
            "same machine lease",
            f"on a later lease the {len(later_pins)} pins read " + ", ".join(f"{g:+.1%}" for g in later_gain)
            + f": {below} of {len(later_pins)} below the {MIN_EFFECT:.0%} floor"]


def timing_figures() -> list[str]:
    data = json.loads((RESULTS / "readme_timings.json").read_text())
    runs = data["runs"]
    assert runs and all(p["rc"] == 0 for r in runs for p in r["parts"]) and {r["cores"] for r in runs} == {2}

    def having(name):
        return [r for r in runs if any(p["part"] == name for p in r["parts"])]

    def part(name):
        return " and ".join(_duration(p["seconds"]) for r in runs for p in r["parts"] if p["part"] == name)

    def when(rs):
        dates = sorted({r["date"] for r in rs})
        return dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}"
    # the times belong to the commits and test counts they were taken at: README says which (a run may
    # time the quick tests alone: then not from a fresh clone, which its "how" says)
    counts = " and ".join(re.search(r"(\d+) passed", r["quick tests result"]).group(1) for r in having("quick tests"))
    commits = " and ".join(r["commit"][:7] for r in having("main job"))
    return [f"the quick ones: {part('quick tests')} on 2 cores, {when(having('quick tests'))}, at {counts} tests",
            f"{part('main job')} on 2 cores from a fresh clone, after a setup of {part('setup')} "
            f"({when(having('main job'))}, commits {commits}; scripts/time_readme_commands.py times them again; "
            "benchmarks/results/readme_timings.json)"]


def install_figures() -> list[str]:
    mib = {m[1]: int(m[2]) for m in re.finditer(r"^(\S+)==\S+\s+#\s+(\d+) MiB", (ROOT / "requirements/cpu.lock")
                                                .read_text(), re.M)}
    heavy = sum(v for k, v in mib.items() if k.startswith(("torch", "triton", "nvidia-", "cuda-")))
    gb = lambda m: f"{m * 2 ** 20 / 1e9:.0f} GB"          # noqa: E731
    from autotune.search.study import TuneSettings
    return [f"unpacking its {gb(sum(mib.values()))}, {gb(heavy)} of them torch, Triton and the CUDA libraries",
            f"the last {TuneSettings.polish:.0%} of a study's trials polish"]


def sieve_figures() -> list[str]:
    """The H200 sieve's two marlin NVFP4 MoE runners, decode totals, every committed run."""
    runs = sorted(RESULTS.glob("h200_sieve_2026-12-04b/call*_sieve/backend_choice.json"))
    totals = [json.loads(p.read_text())["families"]["moe_fp4"]["server_choice"]["decode"]["totals"] for p in runs]
    gap = max(abs(t["marlin"] / t["experimental_sgl_marlin"] - 1) for t in totals)
    return [f"experimental_sgl_marlin and marlin differ by at most {gap:.1%} in {len(runs)} runs"]


WARM_START = {shape: RESULTS / f"h200_warm_start_{shape}_2026-12-02.json" for shape in ("122b_tp8", "397b_tp4")}


def _warm_rows(shape: str) -> dict:
    (result,) = json.loads(WARM_START[shape].read_text())
    return result["per_M"]


def warm_start_figures() -> list[str]:
    """docs/PERFORMANCE.md's warm vs cold start on the H200: both tables row by row, and what the text draws
    from them (benchmarks/warm_start_h200.py over the committed storages)."""
    rows = _warm_rows("122b_tp8")
    out = [f"| {M} | {r['best_us']:.2f} | {r['cold_s']:.1f} | {r['warm_s']:.1f} | {r['cold_s5']:.1f} | "
           f"{r['warm_s5']:.1f} | {r['cold_first_us']:.1f} / {r['warm_first_us']:.1f} |" for M, r in rows.items()]
    selected = [(r["cold_selected_us"], r["warm_selected_us"]) for r in rows.values()]
    apart = max(_apart(c, w) for c, w in selected)
    out.append(f"the two runs' selected pairs, re-measured, are within {apart:.2%} of each other at every M ("
               + ", ".join(f"{c:.2f} / {w:.2f}" for c, w in selected) + " µs)")
    warm_first = [f"{r['warm_first_us'] / r['best_us'] - 1:+.1%}" for r in rows.values()]
    cold_first = [r["cold_first_us"] / r["best_us"] for r in rows.values()]
    Ms = list(rows)
    out.append(f"The warm start's first results are {', '.join(warm_first[:-1])} and {warm_first[-1]} off the best at "
               f"M={', '.join(Ms[:-1])} and {Ms[-1]} (cold's are {min(cold_first):.1f}-{max(cold_first):.1f}x off)")
    same = max(abs(r["cold_s"] - r["warm_s"]) for r in rows.values())
    out.append(f"is the same both ways (within {same:.1f} s, one seed)")
    rows = _warm_rows("397b_tp4")
    out += [f"| {M} | {r['best_us']:.2f} | {r['cold_s']:.1f} | {r['warm_s']:.1f} | {r['cold_final_us']:.2f} | "
            f"{r['warm_final_us']:.2f} |" for M, r in rows.items()]
    sooner = [r["cold_s"] - r["warm_s"] for r in rows.values()]
    final = max(_apart(r["warm_final_us"], r["cold_final_us"]) for r in rows.values())
    return out + [f"Warm reaches 2% {min(sooner):.1f}-{max(sooner):.1f} s sooner",
                  f"both runs end at the same configs within {final:.1%}"]


def sieve_total_figures() -> list[str]:
    """docs/PERFORMANCE.md: how far each family's chosen decode total moved across the H200 sieve's runs."""
    moved = {}
    for path in sorted(RESULTS.glob("h200_sieve_2026-12-04b/call*_sieve/backend_choice.json")):
        for family, f in json.loads(path.read_text())["families"].items():
            pick = f["server_choice"]["decode"]
            moved.setdefault(family, []).append(pick["totals"][pick["backend"]])
    spans = sorted(((max(xs) / min(xs) - 1, family, min(xs), max(xs)) for family, xs in moved.items()), reverse=True)
    assert len(moved) == 4 and {len(xs) for xs in moved.values()} == {3}
    return [f"the chosen totals moved by up to {spans[0][0]:.1%} ("
            + "; ".join(f"{family} {lo:.1f}-{hi:.1f} µs, {span:.1%}" for span, family, lo, hi in spans) + ")"]


def validate_figures() -> list[str]:
    """docs/VALIDATE.md on the block-FP8 rank under SGLang 0.5.16: the bench_one_batch table row by row (per
    arm the median and range of ms per step over the repeats), the two identical arms' difference, and
    the server's gains set beside bench_one_batch's."""
    rec = json.loads(VALIDATIONS["0.5.16"].read_text())
    runs = [r for r in rec["runs"] if r["dtype"] == "fp8_block" and r["mode"] == "one_batch"]
    out, apart, bench = [], [], {}
    for x in sorted({int(b) for r in runs for b in r["per_batch"]}):
        ms = {arm: [r["per_batch"][str(x)]["ms_per_step"] for r in runs if r["arm"] == arm]
              for arm in ("default", "shipped", "tuned")}
        med = {arm: statistics.median(v) for arm, v in ms.items()}
        cell = {arm: f"{med[arm]:.2f} ({min(v):.2f}-{max(v):.2f})" for arm, v in ms.items()}
        out.append(f"| {x} | {cell['default']} | {cell['shipped']} | {cell['tuned']} | {x * 1000 / med['tuned']:,.0f} | "
                   f"{med['shipped'] / med['tuned'] - 1:+.1%} | {med['default'] / med['tuned'] - 1:+.1%} |")
        apart.append(_apart(med["default"], med["shipped"]))
        bench[x] = med["default"] / med["tuned"] - 1
    server = {c["x"]: c["tuned_median"] / c["baseline_median"] - 1 for c in rec["comparisons"]
              if c["extra"] == {"mode": "server", "dtype": "fp8_block", "baseline_arm": "default"}}
    return out + [f"The two identical arms differ by {_pct_range(apart)} in the table",
                  f"(+{server[64]:.0%}/+{server[128]:.0%} against +{bench[64]:.0%}/+{bench[128]:.0%})"]


PACE = RESULTS / "h100_issue42_2026-12-06"


FINAL_PACE = ("d10", "d11")    # the H100 runs of the default flags on the final code


def pace_figures() -> list[str]:
    """The H100 runs at the issue's default flags: the GPU's wait for builds, the budget and the wall times."""
    runs = [json.loads((PACE / f"pace_{t}.json").read_text())["pace"] for t in FINAL_PACE]
    walls = sorted(re.search(r"wall ([\d.]+) s \(budget", (PACE / f"pace_{t}.log").read_text()).group(1)
                   for t in FINAL_PACE)
    waits = sorted({d["waited_for_builds_s"] for d in runs})
    return [f"waited {'-'.join(map(str, waits))} s for compiles", f"--budget {runs[0]['budget_s']:.0f}s",
            f"{'-'.join(walls)} s"]


def pace_doc_figures() -> list[str]:
    """docs/PERFORMANCE.md's issue-42 figures, from the runs' summaries, the agreement and the decode verdict."""
    out = []
    for t in FINAL_PACE:
        d = json.loads((PACE / f"pace_{t}.json").read_text())["pace"]
        wall = re.search(r"wall ([\d.]+) s \(budget", (PACE / f"pace_{t}.log").read_text()).group(1)
        out += [f"| **{d['measurements']}** |", f"**{d['gpu_busy_share']:.0%}**", f"**{wall} s"]
    for name in ("layer_agreement_2.json", "layer_agreement_3.json"):
        agree = json.loads((PACE / name).read_text())["rows"]
        out.append(f"{name}{': ' if name.endswith('3.json') else ''}")
        out.append(f"largest difference {100 * max(abs(r['tool_vs_sglang']) for r in agree):.1f}% over")
    for v in json.loads((PACE / "decode_disputed" / "verdict.json").read_text()):
        out.append(f"{v['tuned_median']:.1f} vs shipped {v['baseline_median']:.1f} tok/s" if v["x"] == 1 else
                   f"{v['tuned_median']:.1f} vs {v['baseline_median']:.1f} tok/s")
        out.append(f"threshold {100 * v['threshold']:.1f}%: {v['verdict']}")
    return out


def readme_figures() -> list[str]:
    return (gate_figures("0.5.23") + gate_figures("0.5.16") + tactic_figures() + timing_figures() + install_figures()
            + sieve_figures() + pace_figures())


@pytest.mark.parametrize("figure", readme_figures())
def test_readme_says_what_the_data_says(figure):
    assert figure in flat(ROOT / "README.md")


def test_every_figure_in_readme_is_one_tied_to_data():
    text = flat(ROOT / "README.md")
    for figure in readme_figures():
        text = text.replace(figure, "")
    assert FIGURE.findall(text) == []


DOC_FIGURES = {"docs/PERFORMANCE.md": lambda: warm_start_figures() + sieve_total_figures() + pace_doc_figures(),
               "docs/VALIDATE.md": validate_figures}


@pytest.mark.parametrize("doc, figure", [(doc, f) for doc, figures in DOC_FIGURES.items() for f in figures()])
def test_the_docs_say_what_the_data_says(doc, figure):
    assert figure in flat(ROOT / doc)


@pytest.mark.parametrize("release", sorted(VALIDATIONS))
def test_validate_md_quotes_each_gate_summary(release):
    text = flat(ROOT / "docs/VALIDATE.md")
    for line in gate_figures(release)[:2]:
        assert line in text
