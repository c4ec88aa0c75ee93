"""Every measured figure in README.md is what the committed data says.

Each figure is recomputed from the committed file it comes from (the validations' gate, the
FlashInfer cache probes, the fresh-clone timings, the CPU lock, the code's own constants) and must
appear in README as written; then every figure-looking number left in README (a percentage, a size,
a duration, "K of N") fails the test: a new figure has to be tied to data here, or go.
docs/VALIDATE.md quotes the same gate summaries.
"""
import json
import re
import statistics
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
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
    from autotune.measure import MIN_EFFECT
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

    def part(name):
        return " and ".join(_duration(p["seconds"]) for r in runs for p in r["parts"] if p["part"] == name)
    dates = sorted({r["date"] for r in runs})
    date = dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}"
    return [f"the quick ones: {part('quick tests')} on 2 cores, {date}",
            f"{part('main job')} on 2 cores from a fresh clone, after a setup of {part('setup')} ({date}; "
            "benchmarks/results/readme_timings.json)"]


def install_figures() -> list[str]:
    mib = {m[1]: int(m[2]) for m in re.finditer(r"^(\S+)==\S+\s+#\s+(\d+) MiB", (ROOT / "requirements/cpu.lock")
                                                .read_text(), re.M)}
    heavy = sum(v for k, v in mib.items() if k.startswith(("torch", "triton", "nvidia-", "cuda-")))
    gb = lambda m: f"{m * 2 ** 20 / 1e9:.0f} GB"          # noqa: E731
    from autotune.study import TuneSettings
    return [f"unpacking its {gb(sum(mib.values()))}, {gb(heavy)} of them torch, Triton and the CUDA libraries",
            f"the last {TuneSettings.polish:.0%} of a study's trials polish"]


def sieve_figures() -> list[str]:
    """The H200 sieve's two marlin NVFP4 MoE runners, decode totals, every committed run."""
    runs = sorted(RESULTS.glob("h200_sieve_2026-12-04b/call*_sieve/backend_choice.json"))
    totals = [json.loads(p.read_text())["families"]["moe_fp4"]["server_choice"]["decode"]["totals"] for p in runs]
    gap = max(abs(t["marlin"] / t["experimental_sgl_marlin"] - 1) for t in totals)
    return [f"experimental_sgl_marlin and marlin differ by at most {gap:.1%} in {len(runs)} runs"]


def readme_figures() -> list[str]:
    return (gate_figures("0.5.23") + gate_figures("0.5.16") + tactic_figures() + timing_figures() + install_figures()
            + sieve_figures())


@pytest.mark.parametrize("figure", readme_figures())
def test_readme_says_what_the_data_says(figure):
    assert figure in flat(ROOT / "README.md")


def test_every_figure_in_readme_is_one_tied_to_data():
    text = flat(ROOT / "README.md")
    for figure in readme_figures():
        text = text.replace(figure, "")
    assert FIGURE.findall(text) == []


@pytest.mark.parametrize("release", sorted(VALIDATIONS))
def test_validate_md_quotes_each_gate_summary(release):
    text = flat(ROOT / "docs/VALIDATE.md")
    for line in gate_figures(release)[:2]:
        assert line in text
