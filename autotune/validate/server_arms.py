"""Results of SGLang's own server code, three fused-MoE config arms: default, shipped, tuned.

`scripts/sglang_arms_h200.sh` runs, per repeat and in rotating order, one SGLang process per arm
and leaves in its folder, per run, `<mode>_<dtype>_r<repeat>_<arm>.log` (SGLang's log) and:
- mode `one_batch`: `.jsonl`, SGLang's bench_one_batch result lines (`one_batch_module`; one per batch
  size: `median_decode_latency`, seconds per decode step of SGLang's ModelRunner with CUDA graphs,
  no scheduler or HTTP);
- mode `server`: `.probe.jsonl`, scripts/sglang_decode_probe.py against `python -m
  sglang.launch_server` (`decode_tok_s_median`: decode tokens/s of a batch of requests through
  HTTP and the scheduler).

The arms are told apart by what SGLang says it loaded, never by the run's name alone: each log's
config lines are the evidence (`evidence`), and a run whose log contradicts its arm (a tuned run
that did not load the tuned folder's file, a default run that found a file) is refused.
"""
from __future__ import annotations

import json
import math
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from autotune.fileio.writing import save_figure
from autotune.validate import BenchmarkError
from autotune.validate.gate import Comparison, Judging, KnownSpread, comparisons_from_runs, relative_sigma

ARMS = ("default", "shipped", "tuned")
MEASURED_BY = {"one_batch": "bench_one_batch", "server": "server"}
# What a one-run arm borrows as its noise (gate.KnownSpread): the relative sigma of one run of each
# method on the lent H200, pooled (root mean square) over every (SGLang release, dtype, arm, batch) with
# two or more runs in the committed runs. tests/validate/test_server_arms.py recomputes both from those tarballs
# with instance_spread() and fails when they drift from what the data says.
_SPREAD_FROM = ("benchmarks/data/h200_sglang016_arms*_2026-12-02.tgz and h200_sglang023_arms_2026-12-02.tgz, "
                "{n} (release, dtype, arm, batch) groups with 2-3 runs, root mean square of their relative sigmas")
INSTANCE_SPREAD = {"one_batch": KnownSpread(0.031, "SGLang bench_one_batch on the H200: " + _SPREAD_FROM.format(n=54)),
                   "server": KnownSpread(0.035, "SGLang server + probe on the H200: " + _SPREAD_FROM.format(n=18))}
RUN_NAME = re.compile(r"^(?P<mode>one_batch|server)_(?P<dtype>\w+?)_r(?P<rep>\d+)_(?P<arm>default|shipped|tuned)$")
# SGLang 0.5.16-0.5.23, fused_moe_triton_config.get_moe_configs / try_get_optimal_moe_config.
# A path runs to ".json" and may hold a space (block-FP8 files end in "block_shape=[128, 128].json").
_PATH = r"(?P<path>/.+?\.json)(?=[\s.,;]|$)"
_LOADED = re.compile(r"Using MoE kernel config from " + _PATH)
_FALLBACK = re.compile(r"Fallback to triton version (?P<ver>[\d.]+) and use MoE kernel config from " + _PATH)
_DEFAULT = re.compile(r"Using default MoE kernel config\..*?Config file not found at " + _PATH)
_STAMP = re.compile(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")
_DOWN_REUSED = re.compile(r"Down MoE config file not found at " + _PATH + r"; reusing the tuned up-projection")


def one_batch_module(version: str) -> str:
    """The module `python -m` runs for SGLang's bench_one_batch: 0.5.23 moved it into sglang.benchmark."""
    from autotune.adapters.sglang_versions import release_key
    return "sglang.benchmark.one_batch" if release_key(version) >= (0, 5, 23) else "sglang.bench_one_batch"


@dataclass
class Evidence:
    """What SGLang's log says it loaded for the fused MoE: one entry per line it printed."""
    files: list[str] = field(default_factory=list)        # config files it loaded (exact or fallback)
    defaults: list[str] = field(default_factory=list)     # files it looked for and did not find -> default
    down_reused: list[str] = field(default_factory=list)  # _down files missing: up config reused
    lines: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"files": self.files, "defaults": self.defaults, "down_reused": self.down_reused, "lines": self.lines}


def evidence(log_text: str) -> Evidence:
    ev = Evidence()
    for raw in log_text.splitlines():
        line = raw.split("\r")[-1]                   # tqdm's carriage returns share the line
        hit = False
        for m in _FALLBACK.finditer(line):
            ev.files.append(m["path"]); hit = True
        if not hit:
            for m in _LOADED.finditer(line):
                ev.files.append(m["path"]); hit = True
        for m in _DEFAULT.finditer(line):
            ev.defaults.append(m["path"]); hit = True
        for m in _DOWN_REUSED.finditer(line):
            ev.down_reused.append(m["path"]); hit = True
        if hit:
            stamp = _STAMP.search(line)            # from SGLang's "[date time ...]" prefix on
            ev.lines.append(line[stamp.start():].strip() if stamp else line.strip())
    return ev


def check_arm(arm: str, ev: Evidence, tuned_dir: str | None) -> str | None:
    """Why the log contradicts the arm, or None."""
    if arm == "default":
        return None if ev.defaults and not ev.files else "SGLang did not fall back to its default config"
    if arm == "shipped" and not ev.files and ev.defaults:
        return None          # SGLang ships no file for this shape: its default is what it ships
    if not ev.files:
        return "SGLang loaded no MoE config file"
    if arm == "tuned":
        # The folder may sit elsewhere on the machine that ran SGLang: match its last two parts.
        marker = "/" + "/".join(Path(tuned_dir).parts[-2:]) + "/configs/" if tuned_dir else None
        if ev.defaults or (marker and not all(marker in f for f in ev.files)):
            return f"SGLang did not load the tuned folder's files (loaded: {', '.join(ev.files) or 'none'})"
    return None


@dataclass
class ArmRun:
    name: str
    mode: str
    dtype: str
    repeat: int
    arm: str
    evidence: Evidence
    per_batch: dict[int, dict]           # batch -> {"tok_s": decode tokens/s, "ms_per_step": ..., raw}

    def to_dict(self) -> dict:
        return {"name": self.name, "mode": self.mode, "dtype": self.dtype, "repeat": self.repeat, "arm": self.arm,
                "evidence": self.evidence.to_dict(), "per_batch": {str(k): v for k, v in self.per_batch.items()}}


def _results(log: Path, mode: str) -> dict[int, dict]:
    out: dict[int, dict] = {}
    if mode == "one_batch":
        path = log.with_suffix(".jsonl")
        for row in _jsonl(path):
            step_s = float(row["median_decode_latency"])
            out[int(row["batch_size"])] = {"tok_s": row["batch_size"] / step_s, "ms_per_step": 1000 * step_s,
                                           "input_len": row.get("input_len"), "output_len": row.get("output_len")}
    else:
        path = log.with_suffix(".probe.jsonl")
        for row in _jsonl(path):
            out[int(row["batch"])] = {"tok_s": float(row["decode_tok_s_median"]),
                                      "ms_per_step": float(row["ms_per_step_median"]),
                                      "tok_s_reps": row.get("decode_tok_s"), "input_len": row.get("input_len"),
                                      "decode_steps": row.get("decode_steps")}
    return out


def _jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    rows = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise BenchmarkError(f"{path}:{i}: not a JSON result line ({e})") from None
    return rows


def read_runs(folder: str | Path, tuned_dir: str | None) -> tuple[list[ArmRun], list[str]]:
    """Every run in `folder` (runs: those with results; problems: one line per run refused or empty)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise BenchmarkError(f"runs folder {folder} does not exist")
    runs, problems = [], []
    for log in sorted(folder.glob("*.log")):
        m = RUN_NAME.match(log.stem)
        if not m:
            continue
        # a run cut short before its results may also be before SGLang loads its MoE config: say the first
        res = _results(log, m["mode"])
        if not res:
            problems.append(f"{log.stem}: no results (the run failed or was cut short; see its log)")
            continue
        ev = evidence(log.read_text(errors="replace"))
        why = check_arm(m["arm"], ev, tuned_dir)
        if why:
            problems.append(f"{log.stem}: {why}")
            continue
        runs.append(ArmRun(log.stem, m["mode"], m["dtype"], int(m["rep"]), m["arm"], ev, res))
    return runs, problems


def run_environment(folder: str | Path) -> dict:
    """env.txt of a runs folder: GPU line (name, driver, memory) and the versions line."""
    p = Path(folder) / "env.txt"
    out: dict = {}
    if not p.exists():
        return out
    for line in p.read_text().splitlines():
        if line.startswith("torch "):
            for part in line.split("|"):
                k, _, v = part.strip().partition(" ")
                out[k] = v.strip()
        elif "," in line and not out.get("gpu"):
            name, driver, *rest = (x.strip() for x in line.split(","))
            out.update(gpu=name, driver=driver, memory=rest[0] if rest else None)
    return out


def comparisons(runs: list[ArmRun], baseline: str, *, min_effect: float = 0.01) -> list[Comparison]:
    """tuned vs `baseline` per (measurement, dtype, batch), decode tokens/s, paired by repeat
    (gate.comparisons_from_runs: the same pairing and noise rule as every other validation); a
    one-run arm borrows its method's INSTANCE_SPREAD."""
    records = [{"side": "baseline" if r.arm == baseline else "tuned", "repeat": r.repeat,
                "kind": (r.mode, r.dtype), "x": b, "metrics": {"tok_s": v["tok_s"]}}
               for r in runs if r.arm in (baseline, "tuned") for b, v in r.per_batch.items()]
    out = comparisons_from_runs(records, "tok_s", unit="tok/s", judging=Judging(min_effect), against=baseline,
                                label=lambda kind, x: f"{MEASURED_BY[kind[0]]} {kind[1]} vs {baseline}, batch {x}",
                                known_spread=lambda kind: INSTANCE_SPREAD[kind[0]])
    for c in out:
        what, dtype = c.point.split(" vs ")[0].split(" ", 1)
        c.extra = {"mode": next(m for m, n in MEASURED_BY.items() if n == what), "dtype": dtype,
                   "baseline_arm": baseline}
    return out


def instance_spread(run_sets: list[list[ArmRun]], mode: str) -> tuple[float, int]:
    """One run's relative sigma for `mode`, pooled (root mean square) over every (set, dtype, arm,
    batch) with two or more runs; each set is one release's runs. Returns (sigma, groups)."""
    sigmas = []
    for runs in run_sets:
        groups: dict[tuple, list[float]] = {}
        for r in runs:
            if r.mode == mode:
                for b, v in r.per_batch.items():
                    groups.setdefault((r.dtype, r.arm, b), []).append(v["tok_s"])
        sigmas += [relative_sigma(xs) for xs in groups.values() if len(xs) >= 2]
    return math.sqrt(sum(s * s for s in sigmas) / len(sigmas)), len(sigmas)


def table(runs: list[ArmRun]) -> list[dict]:
    """Per (mode, dtype, batch): each arm's median ms/step and tok/s, min..max, runs."""
    rows = []
    for mode, dtype, b in sorted({(r.mode, r.dtype, b) for r in runs for b in r.per_batch}):
        row = {"mode": mode, "dtype": dtype, "batch": b}
        for arm in ARMS:
            ms = [r.per_batch[b]["ms_per_step"] for r in runs
                  if r.arm == arm and r.mode == mode and r.dtype == dtype and b in r.per_batch]
            row[arm] = ({"ms_per_step": statistics.median(ms), "min": min(ms), "max": max(ms), "runs": len(ms),
                         "tok_s": b * 1000 / statistics.median(ms)} if ms else None)
        rows.append(row)
    return rows


def markdown(rows: list[dict]) -> str:
    head = ("| measured by | batch | default ms/step | shipped ms/step | tuned ms/step | tuned speed-up vs shipped | "
            "tuned speed-up vs default |")
    out = [head, "|" + "---|" * 7]
    for r in rows:
        def cell(a):
            v = r[a]
            return "-" if not v else f"{v['ms_per_step']:.2f} ({v['min']:.2f}-{v['max']:.2f}, n={v['runs']})"

        def gain(a):
            return "-" if not (r[a] and r["tuned"]) else f"{r[a]['ms_per_step'] / r['tuned']['ms_per_step'] - 1:+.1%}"
        what = "bench_one_batch" if r["mode"] == "one_batch" else "server + probe"
        out.append(f"| {what} {r['dtype']} | {r['batch']} | {cell('default')} | {cell('shipped')} | {cell('tuned')} | "
                   f"{gain('shipped')} | {gain('default')} |")
    return "\n".join(out)


def plot_arms(path: Path, rows: list[dict], *, title: str) -> bool:
    """Decode speed of each arm relative to SGLang's shipped files, per batch size, one panel per
    measurement (bench_one_batch, server): median, with the min..max of the runs as bars."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    modes = sorted({(r["mode"], r["dtype"]) for r in rows})
    fig, axes = plt.subplots(1, len(modes), figsize=(6 * len(modes), 4.5), dpi=120, squeeze=False)
    style = {"default": ("tab:gray", "v"), "shipped": ("black", "s"), "tuned": ("tab:blue", "o")}
    for ax, (mode, dtype) in zip(axes[0], modes):
        rs = sorted((r for r in rows if r["mode"] == mode and r["dtype"] == dtype and r["shipped"]),
                    key=lambda r: r["batch"])
        xs = [r["batch"] for r in rs]
        for arm in ARMS:
            pts = [(x, r) for x, r in zip(xs, rs) if r[arm]]
            if not pts:
                continue
            ref = [r["shipped"]["ms_per_step"] for _, r in pts]
            med = [f / r[arm]["ms_per_step"] for f, (_, r) in zip(ref, pts)]   # speed relative to shipped
            lo = [m - f / r[arm]["max"] for m, f, (_, r) in zip(med, ref, pts)]
            hi = [f / r[arm]["min"] - m for m, f, (_, r) in zip(med, ref, pts)]
            color, marker = style[arm]
            ax.errorbar([x for x, _ in pts], med, yerr=[lo, hi], color=color, marker=marker, capsize=3, label=arm)
        ax.axhline(1.0, color="black", linewidth=0.6)
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs)
        ax.set_xticklabels([str(x) for x in xs])
        ax.set_xlabel("decode batch size")
        ax.set_ylabel("decode speed / shipped (higher is faster)")
        ax.set_title(f"{'bench_one_batch' if mode == 'one_batch' else 'server + probe'}, {dtype}")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    try:
        save_figure(fig, path)
    finally:
        plt.close(fig)
    return True
