"""Telling a gain from noise, and the gate that refuses regressions.

Design. Baseline and tuned are measured in pairs: repeat i runs both sides back to back, in
alternating order (ABBA), so slow drift of the machine (clocks, temperature, other tenants) hits
both members of a pair alike and cancels in the pair's ratio r_i = tuned_i / baseline_i
(throughput: > 1 is a gain). Per tested point (batch size or concurrency):

- the effect is the median of the pair ratios (robust to one disturbed pair);
- the noise is the run-to-run spread of those ratios, sigma: from the range for 2..5 pairs
  (range / d2(n), the classic small-sample estimator: d2 = 1.128, 1.693, 2.059, 2.326) and from the
  median absolute deviation for 6 or more (1.4826 x MAD, which ignores one wild pair); with one
  pair there is no noise estimate and only the floor below applies (flagged);
- the uncertainty of the median is se = 1.2533 x sigma / sqrt(n) (the median's efficiency factor
  sqrt(pi/2), conservative for small n);
- the threshold is max(min_effect, z x se), z = 2 by default (about 95 % one-sided for a normal
  spread), min_effect = 1 % by default: a change smaller than that is never called, whatever
  the spread, since a 1 % shift is within what server restarts alone produce;
- verdict: "regression" when the ratio is below 1 - threshold, "gain" above 1 + threshold,
  "within noise" otherwise.

When the two sides have different numbers of runs (a failed run), pairs are not formed: the
effect is the ratio of the medians and sigma combines the two sides' relative spreads
(sqrt(s_b^2 + s_t^2), each from the same range / MAD rule).

Each side's own spread is reported as (p75 - p25) / median (min..max below four runs), the
definition autotune's kernel timings use (autotune.measure).

The gate fails when any point's verdict is "regression" and names the point with both medians,
their spreads, the ratio and the threshold; `allow_regression` records the same facts and passes.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field

from ..measure import _quartiles

D2 = {2: 1.128, 3: 1.693, 4: 2.059, 5: 2.326}
MAD_TO_SIGMA = 1.4826
MEDIAN_SE = math.sqrt(math.pi / 2)      # 1.2533


def robust_sigma(xs: list[float]) -> float | None:
    """Standard deviation estimate: range / d2(n) for n <= 5, 1.4826 MAD beyond; None for n < 2."""
    n = len(xs)
    if n < 2:
        return None
    if n in D2:
        return (max(xs) - min(xs)) / D2[n]
    med = statistics.median(xs)
    return MAD_TO_SIGMA * statistics.median(abs(x - med) for x in xs)


def spread(xs: list[float]) -> float:
    """(p75 - p25) / median, or (max - min) / median below four values (autotune.measure's rule)."""
    if not xs:
        return float("nan")
    q1, med, q3 = _quartiles(list(xs))
    return (q3 - q1) / med if med else 0.0


@dataclass
class Comparison:
    point: str                      # "batch 8", "concurrency 32", ...
    x: int
    baseline: list[float]
    tuned: list[float]
    unit: str
    baseline_median: float
    tuned_median: float
    baseline_spread: float
    tuned_spread: float
    ratio: float                    # tuned / baseline (> 1: tuned is faster)
    paired: bool
    ratios: list[float]
    sigma: float | None             # run-to-run noise of the ratio (None: one pair, not estimated)
    threshold: float                # relative: a ratio outside 1 +- threshold is beyond noise
    verdict: str                    # "gain" | "within noise" | "regression"
    extra: dict = field(default_factory=dict)

    @property
    def gain(self) -> float:
        return self.ratio - 1.0

    def describe(self) -> str:
        noise = "noise not estimated (1 run per side)" if self.sigma is None else f"threshold {self.threshold:.1%}"
        return (f"{self.point}: tuned {self.tuned_median:.1f} {self.unit} (spread {self.tuned_spread:.1%}) vs "
                f"baseline {self.baseline_median:.1f} {self.unit} (spread {self.baseline_spread:.1%}), "
                f"ratio {self.ratio:.3f} ({self.gain:+.1%}), {noise}, {len(self.tuned)}x{len(self.baseline)} runs: "
                f"{self.verdict}")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["gain"] = self.gain
        return d


def compare(point: str, baseline: list[float], tuned: list[float], *, x: int = 0, unit: str = "tok/s",
            min_effect: float = 0.01, z: float = 2.0) -> Comparison:
    """Compare higher-is-better samples of one point (baseline[i] and tuned[i] from repeat i)."""
    b = [float(v) for v in baseline]
    t = [float(v) for v in tuned]
    if not b or not t:
        raise ValueError(f"{point}: no runs on {'the baseline' if not b else 'the tuned'} side")
    if any(not (v > 0 and math.isfinite(v)) for v in b + t):
        raise ValueError(f"{point}: throughputs must be positive and finite, got {b} / {t}")
    bm, tm = statistics.median(b), statistics.median(t)
    paired = len(b) == len(t)
    if paired:
        ratios = [ti / bi for bi, ti in zip(b, t)]
        ratio = statistics.median(ratios)
        sigma = robust_sigma(ratios)
        n = len(ratios)
    else:
        ratios = []
        ratio = tm / bm
        sb, st = robust_sigma([v / bm for v in b]), robust_sigma([v / tm for v in t])
        sigma = None if sb is None and st is None else math.hypot(sb or 0.0, st or 0.0) * ratio
        n = min(len(b), len(t))
    se = MEDIAN_SE * sigma / math.sqrt(n) if sigma is not None else 0.0
    thr = max(min_effect, z * se)
    verdict = "regression" if ratio < 1 - thr else "gain" if ratio > 1 + thr else "within noise"
    return Comparison(point, x, b, t, unit, bm, tm, spread(b), spread(t), ratio, paired, ratios, sigma, thr, verdict)


@dataclass
class GateResult:
    passed: bool
    regressions: list[Comparison]
    allow_regression: bool
    lines: list[str]

    @property
    def message(self) -> str:
        return "\n".join(self.lines)

    def to_dict(self) -> dict:
        return {"passed": self.passed, "allow_regression": self.allow_regression,
                "regressions": [c.point for c in self.regressions], "lines": self.lines}


def gate(comparisons: list[Comparison], allow_regression: bool = False) -> GateResult:
    """Fail when tuned is slower than baseline beyond noise at any point; with
    `allow_regression` the regressions are recorded and the gate passes."""
    regs = [c for c in comparisons if c.verdict == "regression"]
    lines = []
    for c in regs:
        lines.append(f"regression at {c.point}: tuned {c.tuned_median:.1f} {c.unit} vs baseline "
                     f"{c.baseline_median:.1f} {c.unit} ({c.gain:+.1%}; spreads {c.tuned_spread:.1%} / "
                     f"{c.baseline_spread:.1%}; noise threshold {c.threshold:.1%})")
    if not regs:
        lines.append(f"gate passed: tuned is not slower than baseline beyond noise at any of "
                     f"{len(comparisons)} tested points")
    elif allow_regression:
        lines.append(f"gate: {len(regs)} regression(s) recorded and allowed (--allow-regression)")
    else:
        lines.append(f"gate FAILED: tuned is slower than baseline beyond noise at {len(regs)} of "
                     f"{len(comparisons)} tested points")
    return GateResult(not regs or allow_regression, regs, allow_regression, lines)


def comparisons_from_runs(runs: list[dict], metric: str = "output_throughput", *, unit: str = "tok/s",
                          min_effect: float = 0.01, z: float = 2.0,
                          label=lambda kind, x: f"{kind} {x}") -> list[Comparison]:
    """Group run records ({"side", "repeat", "kind", "x", "metrics": {...}}) into one comparison
    per (kind, x), pairing the two sides by repeat."""
    groups: dict[tuple, dict[str, dict[int, float]]] = {}
    for r in runs:
        g = groups.setdefault((r["kind"], r["x"]), {"baseline": {}, "tuned": {}})
        g[r["side"]][r["repeat"]] = float(r["metrics"][metric])
    out = []
    for (kind, x), g in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        common = sorted(set(g["baseline"]) & set(g["tuned"]))
        if common and len(common) == len(g["baseline"]) == len(g["tuned"]):
            b = [g["baseline"][i] for i in common]
            t = [g["tuned"][i] for i in common]
        else:
            b, t = list(g["baseline"].values()), list(g["tuned"].values())
        if b and t:
            out.append(compare(label(kind, x), b, t, x=x, unit=unit, min_effect=min_effect, z=z))
    return out
