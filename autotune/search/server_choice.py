"""The one backend per server, per family (SGLang takes one per server): over every problem's
backend tuner (autotune.search.sieve), the SGLang-selectable backend with the least weighted total time
over a batch-size mix, correct on every problem at every M, beside SGLang's `auto`."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from autotune.measure.timing import noise

# Batch-size mixes for the one-backend-per-server choice: decode steps run few tokens, prefill
# chunks many. Equal weight per M inside a mix.
MIXES = {"decode": lambda M: M <= 64, "prefill": lambda M: M >= 512}


@dataclass
class ServerChoice:
    family: str
    mix: str
    backend: str | None              # SGLang-selectable backend with the least total time
    totals: dict                     # backend -> weighted total us (eligible backends)
    auto: str | None
    per_m_total: float | None        # if every (problem, M) could run its own winner
    disqualified: dict               # backend -> "reason at M=..., problem ..."
    skipped: dict                    # backend -> why it never ran here
    mix_measured: bool = True        # False: no batch size of this mix was in the run
    expected: dict = field(default_factory=dict)    # backend -> why its declarations expect it to fail here
    values: dict = field(default_factory=dict)      # backend -> the flag value selecting it (None: none)
    within_noise: str | None = None  # faster than auto by less than the timings' noise, so auto was kept

    def _flag(self, b: str | None) -> str:
        return (self.values.get(b) or b) if b else "-"

    @property
    def auto_line(self) -> str:
        """SGLang's `auto` beside the pick, as one line: "auto -> flashinfer_trtllm: crash at M=1 on
        ...: killed by SIGKILL | picked flashinfer_cutlass"."""
        pick = f"picked {self._flag(self.backend)}" if self.backend else "picked none (no selectable backend ran correctly)"
        if self.auto is None:
            return f"auto -> a backend autotune does not measure | {pick}"
        why = self.disqualified.get(self.auto) or (f"not run: {self.skipped[self.auto]}" if self.auto in self.skipped
                                                   else None)
        gain = f" ({self.gain_vs_auto:.3f}x over auto)" if self.gain_vs_auto and self.backend != self.auto else ""
        if self.within_noise:
            gain = (f" ({self._flag(self.within_noise)} {self.totals[self.auto] / self.totals[self.within_noise]:.3f}x "
                    "faster, within noise)")
        return f"auto -> {self._flag(self.auto)}" + (f": {why}" if why else "") + f" | {pick}{gain}"

    @property
    def auto_fails(self) -> bool:
        return self.auto is not None and self.auto in self.disqualified

    def surprises(self) -> list[str]:
        """Where the outcome is not what the declarations say: a backend expected to fail here that
        ran correctly, or one expected to run that failed (a release changed, or a declaration is off)."""
        out = [f"{b} ran correctly though its declaration expects it to fail here ({why})"
               for b, why in sorted(self.expected.items()) if b in self.totals]
        # one line for these: each one's evidence is already in its own "disqualified" line
        undeclared = sorted(b for b in self.disqualified if b not in self.expected)
        if undeclared:
            out.append(f"failed though nothing declared expects {'it' if len(undeclared) == 1 else 'them'} to "
                       f"(evidence above): {', '.join(undeclared)}")
        return out

    @property
    def summary(self) -> str:
        return self.backend or ("none eligible" if self.mix_measured else "no batch size of it measured")

    @property
    def gain_vs_auto(self) -> float | None:
        if self.backend is None or self.auto not in self.totals:
            return None
        return self.totals[self.auto] / self.totals[self.backend]

    @property
    def per_m_gain(self) -> float | None:
        if self.backend is None or not self.per_m_total:
            return None
        return self.totals[self.backend] / self.per_m_total


def server_choice(family, device, tuners: list, mix: str = "decode") -> ServerChoice:
    """The one backend per server: minimum of sum over problems (weighted by how often a forward
    pass runs them) and the mix's M of the backend's time. Only backends SGLang can select, that
    ran correctly on every problem at every M, are eligible."""
    in_mix = MIXES[mix]
    bad: dict = {}
    for t in tuners:
        for b, m in t.disqualified().items():
            bad.setdefault(b, f"{m.status} at M={m.M} on {t.problem.key}: {m.reason}")
    skipped = {a.backend.name: a.reason for a in family.availability(device) if not a.ok}
    for t in tuners:
        for b, why in t.skipped_here().items():
            skipped.setdefault(b, why)
    selectable = {a.backend.name for a in family.availability(device) if family.sglang_value(a.backend.name)}
    names = set().union(*(t.names for t in tuners)) if tuners else set()
    mix_measured = any(in_mix(M) for t in tuners for M in t.Ms)    # --batch-sizes 1,64: no prefill M
    if not mix_measured:
        names = set()
    totals, per_m = {}, 0.0
    for b in sorted(names - set(bad)):
        total = 0.0
        for t in tuners:
            for M in (M for M in t.Ms if in_mix(M)):
                x = t.time_of(b, M)
                if x is None:
                    total = math.inf
                    break
                total += getattr(t.problem, "layers", 1) * x
        if math.isfinite(total):
            totals[b] = total
    for t in tuners:
        for M in (M for M in t.Ms if in_mix(M)):
            xs = [x for b in names - set(bad) if (x := t.time_of(b, M)) is not None]
            per_m += getattr(t.problem, "layers", 1) * min(xs) if xs else 0.0
    eligible = {b: v for b, v in totals.items() if b in selectable}
    best = min(eligible, key=eligible.get) if eligible else None
    auto, within_noise = family.sglang_auto(device), None
    if best is not None and auto in eligible and best != auto:
        # SGLang's own pick stays unless another backend beats it beyond the noise of either's timings
        # (on the H200 experimental_sgl_marlin "won" over auto's marlin by 1.001x, well inside both spreads)
        spreads = [max((t.spread_of(b, M) for t in tuners for M in t.Ms if in_mix(M)), default=0.0)
                   for b in (best, auto)]
        if eligible[best] * (1 + noise(*spreads)) >= eligible[auto]:
            best, within_noise = auto, best
    plan = family.availability(device)
    return ServerChoice(family.name, mix, best, totals, auto, per_m or None, bad, skipped,
                        mix_measured, expected={a.backend.name: a.expected for a in plan if a.ok and a.expected},
                        values={a.backend.name: family.sglang_value(a.backend.name) for a in plan},
                        within_noise=within_noise)
