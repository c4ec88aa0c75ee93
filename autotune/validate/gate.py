"""Telling a gain from noise, and the gate that refuses regressions.

Design. Baseline and tuned are measured in pairs: repeat i runs both sides back to back, in
alternating order (ABBA), so slow drift of the machine (clocks, temperature, other tenants) hits
both members of a pair alike and cancels in the pair's ratio r_i = tuned_i / baseline_i
(throughput: > 1 is a gain). Per tested point (batch size or concurrency):

- the effect is the median of the pair ratios (robust to one disturbed pair);
- the noise is the run-to-run spread of those ratios, sigma: from the range for 2..5 pairs
  (range / d2(n), the classic small-sample estimator: d2 = 1.128, 1.693, 2.059, 2.326) and from the
  median absolute deviation for 6 or more (1.4826 x MAD, which ignores one wild pair);
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

A side with one run has no scatter of its own, and zero is the one value it certainly is not: it
borrows the larger of the other side's scatter and the method's known instance-to-instance spread
(`KnownSpread`, recorded per engine from committed runs: validate.server_arms.INSTANCE_SPREAD),
and `noise` says which. Either way one run cannot tell a gain from an unlucky start: a point with
fewer than MIN_RUNS runs on either side is "not judged" (its threshold is still shown), never a
gain or a regression. The gate fails when no point at all could be judged.

Each side's own spread is reported as (p75 - p25) / median (min..max below four runs), the
definition autotune's kernel timings use (autotune.measure.timing).

The gate reports every point's verdict with its threshold (`points`), one summary per baseline
("tuned vs shipped: faster beyond noise at K of N points, ..."), and fails when any point's verdict
is "regression", naming it with both medians, their spreads, the ratio and the threshold;
`allow_regression` records the same facts and passes.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Sequence

from autotune.measure.timing import quartiles

D2 = {2: 1.128, 3: 1.693, 4: 2.059, 5: 2.326}
MAD_TO_SIGMA = 1.4826
MEDIAN_SE = math.sqrt(math.pi / 2)      # 1.2533
MIN_RUNS = 2                            # per side, to judge a point at all
NOT_JUDGED = "not judged"


def robust_sigma(xs: list[float]) -> float | None:
    """Standard deviation estimate: range / d2(n) for n <= 5, 1.4826 MAD beyond; None for n < 2."""
    n = len(xs)
    if n < 2:
        return None
    if n in D2:
        return (max(xs) - min(xs)) / D2[n]
    med = statistics.median(xs)
    return MAD_TO_SIGMA * statistics.median(abs(x - med) for x in xs)


def relative_sigma(xs: list[float]) -> float | None:
    """robust_sigma of the values over their median: one run's relative noise (None for n < 2)."""
    if len(xs) < 2:
        return None
    med = statistics.median(xs)
    return robust_sigma([v / med for v in xs])


def spread(xs: list[float]) -> float:
    """(p75 - p25) / median, or (max - min) / median below four values (autotune.measure.timing's rule)."""
    if not xs:
        return float("nan")
    q1, med, q3 = quartiles(list(xs))
    return (q3 - q1) / med if med else 0.0


@dataclass(frozen=True)
class KnownSpread:
    """A method's instance-to-instance spread: the relative sigma of one run, measured elsewhere."""
    sigma: float
    source: str             # where the number comes from (files, how it was computed)


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
    sigma: float | None             # run-to-run noise of the ratio (None: no run scatter and no known spread)
    threshold: float                # relative: a ratio outside 1 +- threshold is beyond noise
    verdict: str                    # "gain" | "within noise" | "regression" | "not judged"
    noise: str = ""                 # where sigma comes from
    against: str = "baseline"       # what the baseline side is ("shipped", "default", ...)
    extra: dict = field(default_factory=dict)

    @property
    def gain(self) -> float:
        return self.ratio - 1.0

    @property
    def judged(self) -> bool:
        return self.verdict != NOT_JUDGED

    def verdict_line(self) -> str:
        """The point's verdict with its threshold, one line."""
        return (f"{self.point}: {self.gain:+.1%} against a threshold of {self.threshold:.1%} "
                f"({len(self.tuned)} tuned x {len(self.baseline)} {self.against} runs): {self.verdict}")

    def describe(self) -> str:
        return (f"{self.point}: tuned {self.tuned_median:.1f} {self.unit} (spread {self.tuned_spread:.1%}) vs "
                f"{self.against} {self.baseline_median:.1f} {self.unit} (spread {self.baseline_spread:.1%}), "
                f"ratio {self.ratio:.3f} ({self.gain:+.1%}), threshold {self.threshold:.1%} (noise: {self.noise}), "
                f"{len(self.tuned)}x{len(self.baseline)} runs: {self.verdict}")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["gain"] = self.gain
        return d


def _side_sigmas(b: list[float], t: list[float], known: KnownSpread | None) -> tuple[float | None, float | None, str]:
    """Relative sigma of each side; a one-run side borrows (never zero). Returns (s_b, s_t, where from)."""
    own = {"baseline": relative_sigma(b), "tuned": relative_sigma(t)}
    sig, notes = dict(own), []
    for side, other in (("baseline", "tuned"), ("tuned", "baseline")):
        if own[side] is not None:
            continue
        options = []
        if own[other] is not None:
            options.append((own[other], f"the {other} side's scatter ({own[other]:.1%})"))
        if known is not None:
            options.append((known.sigma, f"the method's instance-to-instance spread ({known.sigma:.1%}: {known.source})"))
        if options:
            sig[side], why = max(options, key=lambda o: o[0])
            notes.append(f"{side}: 1 run, noise borrowed from {why}" + (", the larger of the two" if len(options) > 1 else ""))
        else:
            notes.append(f"{side}: 1 run, no noise to borrow")
    return sig["baseline"], sig["tuned"], "; ".join(notes)


@dataclass(frozen=True)
class Sides:
    """One point's higher-is-better samples: baseline[i] and tuned[i] from repeat i where `paired`
    (None: where the two lists are as long); `against` names the baseline side ("shipped", ...)."""
    baseline: Sequence[float]
    tuned: Sequence[float]
    against: str = "baseline"
    paired: bool | None = None


@dataclass(frozen=True)
class Judging:
    """When a change is beyond noise: never below `min_effect` (relative), else beyond `z` standard
    errors of the median's noise."""
    min_effect: float = 0.01
    z: float = 2.0


def compare(point: str, sides: Sides, *, x: int = 0, unit: str = "tok/s", judging: Judging = Judging(),
            known_spread: KnownSpread | None = None) -> Comparison:
    """Compare the two sides of one point. `known_spread`: the method's instance-to-instance spread,
    which a one-run side borrows."""
    b = [float(v) for v in sides.baseline]
    t = [float(v) for v in sides.tuned]
    if not b or not t:
        raise ValueError(f"{point}: no runs on {'the baseline' if not b else 'the tuned'} side")
    if any(not (v > 0 and math.isfinite(v)) for v in b + t):
        raise ValueError(f"{point}: throughputs must be positive and finite, got {b} / {t}")
    bm, tm = statistics.median(b), statistics.median(t)
    paired = len(b) == len(t) if sides.paired is None else (sides.paired and len(b) == len(t))
    judged = min(len(b), len(t)) >= MIN_RUNS
    ratios = [ti / bi for bi, ti in zip(b, t)] if paired else []
    if paired and judged:
        ratio = statistics.median(ratios)
        sigma = robust_sigma(ratios)
        noise = f"scatter of the {len(ratios)} paired ratios"
    else:
        ratio = statistics.median(ratios) if paired else tm / bm
        sb, st, noise = _side_sigmas(b, t, known_spread)
        sigma = None if sb is None or st is None else math.hypot(sb, st) * ratio
        noise = noise or f"each side's own scatter ({len(t)} tuned, {len(b)} {sides.against} runs, unpaired)"
    n = min(len(b), len(t))
    se = MEDIAN_SE * sigma / math.sqrt(n) if sigma is not None else 0.0
    thr = max(judging.min_effect, judging.z * se)
    if not judged:
        verdict = NOT_JUDGED
    else:
        verdict = "regression" if ratio < 1 - thr else "gain" if ratio > 1 + thr else "within noise"
    return Comparison(point, x, b, t, unit, bm, tm, spread(b), spread(t), ratio, paired, ratios, sigma, thr,
                      verdict, noise, sides.against)


def summary(comparisons: list[Comparison], against: str) -> str:
    """'tuned vs shipped: faster beyond noise at K of N points, within noise at W, ...'."""
    cs = [c for c in comparisons if c.against == against]
    count = {v: sum(c.verdict == v for c in cs) for v in ("gain", "within noise", "regression", NOT_JUDGED)}
    parts = [f"tuned vs {against}: faster beyond noise at {count['gain']} of {len(cs)} points"]
    if count["within noise"]:
        parts.append(f"within noise at {count['within noise']}")
    if count["regression"]:
        parts.append(f"slower beyond noise at {count['regression']}")
    if count[NOT_JUDGED]:
        parts.append(f"not judged at {count[NOT_JUDGED]} (a side with fewer than {MIN_RUNS} runs)")
    return ", ".join(parts)


@dataclass
class GateResult:
    passed: bool
    regressions: list[Comparison]
    allow_regression: bool
    lines: list[str]                # summaries per baseline, regressions named, the verdict last
    points: list[str] = field(default_factory=list)     # every point's verdict with its threshold
    counts: dict = field(default_factory=dict)          # per baseline: points and each verdict's count

    @property
    def message(self) -> str:
        return "\n".join(self.lines)

    def to_dict(self) -> dict:
        return {"passed": self.passed, "allow_regression": self.allow_regression,
                "regressions": [c.point for c in self.regressions], "lines": self.lines,
                "points": self.points, "counts": self.counts}


def gate(comparisons: list[Comparison], allow_regression: bool = False) -> GateResult:
    """Fail when tuned is slower than baseline beyond noise at any point, or when no point could be
    judged; with `allow_regression` the regressions are recorded and the gate passes."""
    regs = [c for c in comparisons if c.verdict == "regression"]
    judged = [c for c in comparisons if c.judged]
    groups = list(dict.fromkeys(c.against for c in comparisons))
    counts = {g: {"points": sum(c.against == g for c in comparisons),
                  **{v: sum(c.against == g and c.verdict == v for c in comparisons)
                     for v in ("gain", "within noise", "regression", NOT_JUDGED)}} for g in groups}
    lines = [summary(comparisons, g) for g in groups]
    for c in regs:
        lines.append(f"regression at {c.point}: tuned {c.tuned_median:.1f} {c.unit} vs {c.against} "
                     f"{c.baseline_median:.1f} {c.unit} ({c.gain:+.1%}; spreads {c.tuned_spread:.1%} / "
                     f"{c.baseline_spread:.1%}; noise threshold {c.threshold:.1%})")
    unjudged = len(comparisons) - len(judged)
    if not judged:
        lines.append(f"gate FAILED: none of {len(comparisons)} tested points could be judged (each needs at "
                     f"least {MIN_RUNS} runs per side)")
    elif not regs:
        lines.append(f"gate passed: tuned is not slower than baseline beyond noise at any of {len(judged)} judged "
                     f"points" + (f" ({unjudged} of {len(comparisons)} not judged: a side with fewer than "
                                  f"{MIN_RUNS} runs)" if unjudged else ""))
    elif allow_regression:
        lines.append(f"gate: {len(regs)} regression(s) recorded and allowed (--allow-regression)")
    else:
        lines.append(f"gate FAILED: tuned is slower than baseline beyond noise at {len(regs)} of "
                     f"{len(judged)} judged points")
    passed = bool(judged) and (not regs or allow_regression)
    return GateResult(passed, regs, allow_regression, lines, [c.verdict_line() for c in comparisons], counts)


def comparisons_from_runs(runs: list[dict], metric: str = "output_throughput", *, unit: str = "tok/s",
                          judging: Judging = Judging(), label=lambda kind, x: f"{kind} {x}",
                          against: str = "baseline", known_spread=lambda kind: None) -> list[Comparison]:
    """Group run records ({"side", "repeat", "kind", "x", "metrics": {...}}) into one comparison
    per (kind, x), pairing the two sides by repeat; `known_spread(kind)` is that method's
    instance-to-instance spread (a KnownSpread, or None where none is recorded)."""
    groups: dict[tuple, dict[str, dict[int, float]]] = {}
    for r in runs:
        g = groups.setdefault((r["kind"], r["x"]), {"baseline": {}, "tuned": {}})
        g[r["side"]][r["repeat"]] = float(r["metrics"][metric])
    out = []
    for (kind, x), g in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        common = sorted(set(g["baseline"]) & set(g["tuned"]))
        paired = bool(common) and len(common) == len(g["baseline"]) == len(g["tuned"])
        if paired:
            b = [g["baseline"][i] for i in common]
            t = [g["tuned"][i] for i in common]
        else:             # other repeats on each side: never paired by position (repeat 2 with repeat 3)
            b, t = list(g["baseline"].values()), list(g["tuned"].values())
        if b and t:
            out.append(compare(label(kind, x), Sides(b, t, against, paired), x=x, unit=unit, judging=judging,
                               known_spread=known_spread(kind)))
    return out
