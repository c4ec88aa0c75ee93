"""validation.json, the tokens/s plot and report.md, written beside the tuned files.

validation.json holds everything: every run with its metrics, the commands, the versions, the
per-point comparison and the gate. The plot shows tokens/s against batch size (harness) or
concurrency (server), baseline vs tuned, median with the min..max of the runs as error bars.
report.md links the plot and, where the folder has a provenance.json, repeats the tuning run's
per-batch-size kernel tables. All files are written atomically (autotune.fileio.writing).
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from autotune.gpus.device import software_versions, utc_now
from autotune.fileio.writing import (
    FileFormatError,
    WriteError,
    bytes_holding,
    claim_all,
    forced,
    json_with,
    read_json,
    save_figure,
    text_starting,
    write_atomic,
    write_json,
)
from autotune.validate import ValidateError
from autotune.validate.gate import Comparison, GateResult

from autotune.folder.change import PLOT_PNG, REPORT_MD, VALIDATION_JSON  # noqa: F401  (validate's outputs, named where the folder is)
from autotune.folder.tuned import TunedFolder


def build_record(*, engine: str, device: dict, comparisons: list[Comparison], gate: GateResult | None,
                 runs: list[dict], settings: dict, extra: dict | None = None) -> dict:
    """`extra`: the engine's own keys, and `judged` (autotune.validate.judged: what the validation judged)."""
    return {"engine": engine, "date": utc_now(), "device": device, "versions": software_versions(),
            "settings": settings, "comparisons": [c.to_dict() for c in comparisons],
            "gate": gate.to_dict() if gate else None, "runs": runs, **(extra or {})}


def plot(path: Path, comparisons: list[Comparison], *, title: str, x_label: str, y_label: str) -> bool:
    """Tokens/s vs x, baseline vs tuned; returns False when matplotlib is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    series: dict[str, list[Comparison]] = {}
    for c in comparisons:
        series.setdefault(c.point.rsplit(" ", 1)[0], []).append(c)
    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    colors = {"baseline": "tab:gray", "tuned": "tab:blue"}
    markers = [("o", "s"), ("^", "D"), ("v", "P")]
    for k, (name, cs) in enumerate(series.items()):
        cs = sorted(cs, key=lambda c: c.x)
        xs = [c.x for c in cs]
        for j, side in enumerate(("baseline", "tuned")):
            med = [c.baseline_median if side == "baseline" else c.tuned_median for c in cs]
            vals = [c.baseline if side == "baseline" else c.tuned for c in cs]
            err = [[m - min(v) for m, v in zip(med, vals)], [max(v) - m for m, v in zip(med, vals)]]
            label = side if len(series) == 1 else f"{side}, {name}"
            ax.errorbar(xs, med, yerr=err, color=colors[side], marker=markers[k % len(markers)][j],
                        linestyle=("-" if k == 0 else "--") if len(xs) > 1 else "none", capsize=3, label=label)
    ax.set_xscale("log", base=2)
    xt = sorted({c.x for c in comparisons})
    ax.set_xticks(xt)
    ax.set_xticklabels([str(x) for x in xt])
    ax.set_xlabel(x_label)
    ax.set_ylabel(y_label)
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        save_figure(fig, path)
    finally:
        plt.close(fig)
    return True


def comparison_table(comparisons: list[Comparison], extra_cols: dict[str, dict[str, str]] | None = None) -> str:
    extra_cols = extra_cols or {}
    head = ["point", "baseline (median, spread)", "tuned (median, spread)", "tuned/baseline", "threshold",
            "runs (tuned x baseline)", "verdict"]
    head += list(extra_cols)
    rows = []
    for c in comparisons:
        borrowed = "borrowed" in c.noise
        row = [c.point, f"{c.baseline_median:.1f} {c.unit} ({c.baseline_spread:.1%})",
               f"{c.tuned_median:.1f} {c.unit} ({c.tuned_spread:.1%})", f"{c.ratio:.3f} ({c.gain:+.1%})",
               f"{c.threshold:.1%}" + (" (noise n/a)" if c.sigma is None else " (noise borrowed)" if borrowed else ""),
               f"{len(c.tuned)} x {len(c.baseline)}", c.verdict]
        row += [col.get(c.point, "-") for col in extra_cols.values()]
        rows.append(row)
    return _md_table(head, rows)


def _md_table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(str(x) for x in r) + " |" for r in rows]
    return "\n".join(lines)


def tuning_tables(folder: TunedFolder) -> str:
    """The tuning run's per-M kernel table of each file its provenance lists (markdown)."""
    prov = folder.provenance_as_written() or {}
    out = []
    for fname, info in (prov.get("files") or {}).items():
        per_m = info.get("per_M") or {}
        if not per_m:
            continue
        rows = []
        for M in sorted(per_m, key=lambda k: int(k)):
            e = per_m[M]
            base = [v for v in (e.get("default_us"), e.get("shipped_us")) if isinstance(v, (int, float))]
            tuned = e.get("tuned_us")
            sp = f"{min(base) / tuned:.3f}x" if base and tuned else "-"
            rows.append([M, _us(e.get("default_us")), _us(e.get("shipped_us")), _us(tuned), sp, e.get("source", "-")])
        run = info.get("run", {})
        out.append(f"**{fname}** (measured on {info.get('device', '?')} {info.get('measured_on', '')}, "
                   f"{info.get('date', '?')}; `{run.get('command', '?')}`)\n\n"
                   + _md_table(["M", "default µs", "shipped µs", "tuned µs", "speedup vs best baseline", "winner"],
                               rows))
    return "\n\n".join(out)


def _us(v) -> str:
    return f"{v:.2f}" if isinstance(v, (int, float)) else "-"


# What validate writes into its --out folder, each with what makes an existing file of that name ours.
def report_targets(out_dir: str | Path) -> list:
    out = Path(out_dir)
    return [(out / VALIDATION_JSON, json_with("gate")),
            (out / REPORT_MD, text_starting("# Validation: ")),
            (out / PLOT_PNG, lambda p: bytes_holding(b"autotune")(p) or _named_by_record(p))]


def claim_outputs(out_dir: str | Path, runs_sha256: list[str] | None = None) -> None:
    """Refuse before anything is measured or written where validate's files in `out_dir` are not its
    own, and, for a judgement of recorded runs (`runs_sha256`: validate --from-runs), where the
    validation.json there was not made from the same runs: it is the record of other runs, and is
    replaced only under --force."""
    out = Path(out_dir)
    claim_all(report_targets(out))
    path = out / VALIDATION_JSON
    if runs_sha256 is None or forced() or not path.exists():
        return
    try:
        old = read_json(path, default=None)
    except FileFormatError:
        old = None                  # not ours: claim_all refused it unless --force
    settings = (old.get("settings") if isinstance(old, dict) else None) or {}
    if sorted(settings.get("runs_sha256") or []) == sorted(runs_sha256):
        return
    if settings.get("runs_sha256"):
        theirs = ", ".join(Path(str(r)).name for r in settings.get("runs") or []) or "runs it names by hash"
        why = f"was made from other runs ({theirs})"
    else:
        why = "was not made by --from-runs from runs it names by hash (an older record, or a live run's)"
    raise ValidateError(f"{path} {why}: --from-runs replaces only a validation of the same runs, with its "
                        "report.md and validation.png; name another --out, or pass --force to replace it")


# An absolute path in report.md: a path of the machine that wrote it, or of the one that ran the runs it
# quotes. The report travels (publish commits it into a serving repo): each keeps its last parts only.
# A path ends at '=' as at a space (`--out=/abs/x` names a path after the flag). A path already shortened
# ('…/' and its parts) is one token, left as it is: shortening twice changes nothing.
_ABSOLUTE = re.compile(r"(…/[^\s`'\"()\[\]<>|*=]*)|(?:(?<=:///)|(?<![\w:/.~\\…-]))/[^\s`'\"()\[\]<>|*=]+")
KEPT_PARTS = 4


def portable(text: str) -> tuple[str, bool]:
    """`text` with every absolute path shortened to '…/' and its last KEPT_PARTS parts; whether any was."""
    def short(m: re.Match) -> str:
        if m.group(1) is not None:
            return m.group(0)
        parts = [p for p in m.group(0).split("/") if p]
        return "…/" + "/".join(parts[-KEPT_PARTS:]) if parts else m.group(0)
    out = _ABSOLUTE.sub(short, text)
    return out, out != text


def shown(path: str | Path) -> str:
    """A folder as report.md names it: as given where relative, else relative to the working folder
    where inside it (what a user in that folder types); portable() shortens any other."""
    p = Path(path)
    if p.is_absolute():
        try:
            return p.resolve().relative_to(Path.cwd().resolve()).as_posix() or "."
        except ValueError:
            pass
    return p.as_posix()


def _named_by_record(png: Path) -> bool:
    """A plot from before plots carried our mark: ours where our validation.json beside it names it."""
    try:
        rec = read_json(png.parent / VALIDATION_JSON, default=None)
    except ValueError:
        return False
    return isinstance(rec, dict) and "gate" in rec and (rec.get("files") or {}).get("plot") == png.name


@dataclass(frozen=True)
class Report:
    """What report.md and the plot show around the comparisons: the title, the x axis's label, the
    intro lines, the tuned folder whose provenance's per-batch tables it repeats, extra table
    columns (name -> point -> cell) and `plotter(path) -> bool`, which draws the figure instead of
    the baseline-vs-tuned default."""
    title: str
    x_label: str
    intro: list[str]
    folder: TunedFolder | None = None
    extra_cols: dict[str, dict[str, str]] | None = None
    plotter: Callable[[Path], bool] | None = None


def write_reports(out_dir: str | Path, record: dict, comparisons: list[Comparison],
                  report: Report) -> dict[str, Path]:
    """validation.json, validation.png (when matplotlib is there) and report.md in `out_dir`."""
    out = Path(out_dir)
    claim_outputs(out, (record.get("settings") or {}).get("runs_sha256"))
    # The three change as one: written beside each other in a staging folder, then moved in; where one
    # cannot be written the folder is as it was (a new validation.json beside an old report.md never).
    try:
        out.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=".validate-staged-", dir=out))
    except OSError as e:
        raise WriteError(f"cannot write into {out}: {e.strerror or e}") from None
    try:
        staged = _write_staged(stage, out, record, comparisons, report)
        for p in staged.values():
            os.replace(p, out / p.name)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return {k: out / p.name for k, p in staged.items()}


def _write_staged(stage: Path, out: Path, record: dict, comparisons: list[Comparison],
                  report: Report) -> dict[str, Path]:
    paths = {"json": stage / VALIDATION_JSON, "plot": stage / PLOT_PNG, "md": stage / REPORT_MD}
    unit = comparisons[0].unit if comparisons else "tok/s"
    has_plot = bool(comparisons) and (report.plotter(paths["plot"]) if report.plotter else plot(
        paths["plot"], comparisons, title=report.title, x_label=report.x_label,
        y_label=f"decode throughput ({unit})"))
    record = dict(record)
    record["files"] = {"plot": PLOT_PNG if has_plot else None, "report": REPORT_MD}
    write_json(paths["json"], record)
    md = [f"# Validation: {report.title}", "", *report.intro, ""]
    md += [comparison_table(comparisons, report.extra_cols), ""]
    if any("borrowed" in c.noise for c in comparisons):
        md += ["(noise borrowed): a side with one run has no scatter of its own; it takes the larger of the other "
               "side's scatter and the method's known instance-to-instance spread (per point in validation.json, "
               "`comparisons[].noise`), and one run cannot be judged: such a point is \"not judged\".", ""]
    gate = record.get("gate")
    if gate:
        md += ["**Gate:** " + "  \n".join(gate["lines"]), ""]
    md += [f"![tokens/s vs {report.x_label}]({PLOT_PNG})" if has_plot else
           "(no plot: matplotlib is not installed; `pip install matplotlib`)", ""]
    md += [f"All runs, commands and versions: [{VALIDATION_JSON}]({VALIDATION_JSON}).", ""]
    folder = report.folder
    if folder is not None and folder.has_provenance():
        tables = tuning_tables(folder)
        rel = os.path.relpath(folder.provenance_file, out)
        md += ["## Tuning tables", "", f"From [{folder.provenance_file.name}]({rel}).", ""]
        md += [tables or "(provenance.json lists no per-batch-size results)", ""]
    text, shortened = portable("\n".join(md))
    if shortened:
        text = text.rstrip("\n") + (f"\n\n(Absolute paths are shortened here to their last {KEPT_PARTS} parts, `…/`; "
                                    f"[{VALIDATION_JSON}]({VALIDATION_JSON}) and provenance.json keep them whole.)\n")
    write_atomic(paths["md"], text)
    if not has_plot:
        paths.pop("plot")
    return paths
