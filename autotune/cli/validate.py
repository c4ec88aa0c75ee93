"""`autotune validate`: decode throughput, default vs tuned, through SGLang's server or the harness.

Hook into the CLI with `add_parser(subparsers)` (it sets `fn=cmd_validate`). Exit codes:
0 done (gate passed, or no --gate), 1 --gate failed (a regression beyond noise, or no point judged), 2 bad input or a
failed run (one `autotune: error: ...` line on stderr; `cmd_validate` catches its own
ValidateError / ModelError and returns 2 itself, and no server is left running), 130 on Ctrl-C
(or SIGTERM, turned into KeyboardInterrupt while it runs) after the running server is stopped.
"""
from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import threading
from pathlib import Path

from autotune.cli import inputs
from autotune.errors import one_line
from autotune.validate import HarnessError, ValidateError
from autotune.folder.tuned import TunedFolder

EXIT_GATE_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130
DEFAULT_POINTS = "1,8,32,64,128,256"


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "validate", help="decode throughput, default vs tuned configs (SGLang server or the built-in harness)",
        description="Check tuned configs end to end: baseline (SGLang's defaults) vs tuned, interleaved and "
                    "repeated; writes validation.json, validation.png and report.md.")
    p.add_argument("--engine", choices=("sglang", "harness"), required=True,
                   help="sglang: SGLang's server + its benchmarks (real path); harness: the built-in decode "
                        "harness for GPUs where the server cannot run")
    p.add_argument("--configs", type=inputs.path, help="tuned folder, tuned_configs/<device> (harness default: tuned_configs/<this GPU>)")
    p.add_argument("--tp", type=inputs.count(1), default=1, help="tensor parallel size (server --tp-size; harness per-rank shapes)")
    p.add_argument("--repeats", type=inputs.count(1), help="runs per side, interleaved (default: 3 sglang, 5 harness)")
    p.add_argument("--gate", action="store_true", help="exit 1 when tuned is slower than baseline beyond noise anywhere")
    p.add_argument("--allow-regression", action="store_true", help="record regressions instead of failing the gate")
    p.add_argument("--min-effect", type=inputs.number(0, most=1), default=0.01,
                   help="smallest relative change ever called a gain or regression (default 0.01)")
    p.add_argument("--out", type=inputs.path, help="folder for validation.json / .png / report.md (default: the --configs folder)")
    g = p.add_argument_group("--engine sglang")
    g.add_argument("--model-path", type=inputs.path, help="model folder (config.json + tokenizer; no weights = --load-format dummy)")
    g.add_argument("--concurrencies", type=inputs.int_list(), help=f"serving concurrencies (default {DEFAULT_POINTS})")
    g.add_argument("--input-len", type=inputs.count(1), default=1024, help="prompt tokens per request (default 1024)")
    g.add_argument("--output-len", type=inputs.count(1), default=256, help="generated tokens per request (default 256)")
    g.add_argument("--prompts-per-concurrency", type=inputs.count(1), default=4,
                   help="requests per serving run = this x concurrency, at least 8 (default 4)")
    g.add_argument("--warmup-requests", type=inputs.count(0), default=4, help="serving warm-up requests (default 4)")
    g.add_argument("--no-one-batch", action="store_true", help="skip the single-request one_batch_server run")
    g.add_argument("--server-args", type=inputs.shell_words, default=(), help='extra launch_server arguments for both sides, e.g. '
                                         '--server-args="--mem-fraction-static 0.85"')
    g.add_argument("--port", type=inputs.count(1, 65535), help="server port (default: a free loopback port per start)")
    g.add_argument("--health-timeout", type=inputs.number(positive=True), default=1800.0, help="seconds to wait for a healthy server")
    g.add_argument("--bench-timeout", type=inputs.number(positive=True), default=3600.0, help="seconds one benchmark run may take")
    g.add_argument("--python", type=inputs.executable, default=sys.executable, help="interpreter that has SGLang (default: this one)")
    g.add_argument("--from-runs", metavar="DIR", action="append", type=inputs.path,
                   help="judge the runs scripts/sglang_arms_h200.sh left in DIR (default, shipped and tuned arms "
                        "of SGLang's own bench_one_batch / server; repeatable) instead of starting servers here")
    g = p.add_argument_group("--engine harness")
    g.add_argument("--model", help="model preset, e.g. qwen3.5-397b-a17b")
    g.add_argument("--model-config", type=inputs.path, help="an HF config.json (or its folder) instead of a preset")
    g.add_argument("--dtype", default="bf16", help="expert dtype: bf16, fp8_w8a8_block, fp8_w8a8 (default bf16)")
    g.add_argument("--batch-sizes", type=inputs.int_list(), help=f"decode batch sizes (default {DEFAULT_POINTS})")
    g.add_argument("--layers", type=inputs.count(1), help="layers in the timed step (default 8, whole 3:1 groups)")
    inputs.add_force(p)
    p.set_defaults(fn=cmd_validate)
    return p


def _ints(text: str | None, what: str) -> tuple[int, ...]:
    from autotune.problems.models import parse_int_list
    return parse_int_list(text or DEFAULT_POINTS, what)


class _SigtermAsInterrupt:
    """SIGTERM raises KeyboardInterrupt while validating, so servers are shut down on the way out."""

    def __enter__(self):
        self.saved = None
        if threading.current_thread() is threading.main_thread():
            def handler(signum, frame):
                raise KeyboardInterrupt
            self.saved = signal.signal(signal.SIGTERM, handler)
        return self

    def __exit__(self, *exc):
        if self.saved is not None:
            signal.signal(signal.SIGTERM, self.saved)


def cmd_validate(args) -> int:
    from autotune.families.triton_moe.moe_layer import LayerError
    from autotune.problems.models import ModelError

    try:
        with _SigtermAsInterrupt():
            if args.engine == "sglang":
                return _validate_sglang(args)
            return _validate_harness(args)
    except (ValidateError, ModelError, LayerError) as e:
        print(f"autotune: error: {one_line(e)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("autotune: validate interrupted; every server it started has been stopped", file=sys.stderr)
        return EXIT_INTERRUPTED


def _finish(args, record_kw: dict, comparisons, out: Path, report) -> int:
    """The gate on `comparisons`, validate's three files in `out` (`report`: a report.Report), the
    table and the verdict printed; the exit code."""
    from autotune.validate.gate import gate as run_gate
    from autotune.validate.report import build_record, comparison_table, write_reports

    result = run_gate(comparisons, allow_regression=args.allow_regression)
    record = build_record(gate=result, comparisons=comparisons, **record_kw)
    paths = write_reports(out, record, comparisons, report)
    print()
    print(comparison_table(comparisons, report.extra_cols))
    print()
    print(result.message)
    for p in paths.values():
        print(f"wrote {p}")
    if args.gate and not result.passed:
        return EXIT_GATE_FAILED
    return 0


def _judged(folder: Path, before: dict, validated_on: str) -> dict:
    """What the validation judged (validate.judged): the folder as it was before measuring, which it
    must still be now (a file changed meanwhile was judged half old, half new)."""
    from autotune.validate.judged import differences, snapshot

    now = snapshot(folder)
    diff = differences(before["sha256"], now["sha256"])
    if diff:
        raise ValidateError(f"{folder} changed while it was validated ({diff}): nothing written; validate it again")
    return {**before, "validated_on": validated_on}


def _check_out(out: Path, runs_sha256: list[str] | None = None) -> None:
    """The --out folder can be written and holds no file of validate's names that is not ours (nor, for
    --from-runs, a validation of other runs)."""
    from autotune.fileio.writing import NotOurs, check_writable
    from autotune.validate.report import claim_outputs
    try:
        check_writable(out)
        claim_outputs(out, runs_sha256)
    except (OSError, NotOurs) as e:
        raise ValidateError(str(e)) from None


# --- sglang ---------------------------------------------------------------------------------------

def _validate_sglang(args) -> int:
    from autotune.adapters.local_gpu import detect
    from autotune.gpus.device import NoDeviceError, utc_now
    from autotune.validate.gate import Judging, comparisons_from_runs
    from autotune.validate.judged import snapshot
    from autotune.validate.report import Report, shown
    from autotune.validate.sglang_commands import check_port_free
    from autotune.validate.sglang_inputs import inspect_configs, inspect_model_dir
    from autotune.validate.sglang_server import ServerValidation, run_server_validation

    if args.batch_sizes:
        raise ValidateError("--batch-sizes is for --engine harness; the server path takes --concurrencies")
    if args.from_runs:
        return _validate_sglang_runs(args)
    if not args.model_path or not args.configs:
        raise ValidateError("--engine sglang needs --model-path DIR and --configs tuned_configs/<device>")
    model = inspect_model_dir(args.model_path)
    configs = inspect_configs(args.configs)
    concurrencies = _ints(args.concurrencies, "--concurrencies")
    if args.port is not None:
        check_port_free(args.port)
    out = Path(args.out) if args.out else configs.root
    _check_out(out)
    judged = snapshot(configs.root)
    stamp = utc_now().replace(":", "").replace("+0000", "Z")
    work = out / "validation_runs" / stamp
    v = ServerValidation(model=model, configs=configs, work_dir=work, concurrencies=concurrencies,
                         repeats=args.repeats or 3, tp=args.tp, input_len=args.input_len, output_len=args.output_len,
                         prompts_per_concurrency=args.prompts_per_concurrency, warmup_requests=args.warmup_requests,
                         one_batch=not args.no_one_batch, extra_server_args=tuple(args.server_args),
                         port=args.port, health_timeout_s=args.health_timeout, bench_timeout_s=args.bench_timeout,
                         python=args.python)
    how = v.check_commands()
    print(f"validate (SGLang server): {model.path} ({'dummy weights' if model.load_format else 'its weights'}), "
          f"tp {args.tp}; tuned folder {configs.root}: {configs.describe()}")
    for module, h in how.items():
        print(f"  command lines checked with SGLang's parser of {module}: {h}")
    print(f"  {v.repeats} repeats x (baseline, tuned) server starts, ABBA; concurrencies "
          f"{','.join(map(str, concurrencies))}; input {v.input_len}, output {v.output_len} tokens; raw results in {work}")
    res = run_server_validation(v)
    label = {"serving": "concurrency", "one_batch": "single request, batch"}

    comparisons = comparisons_from_runs(res["runs"], "output_throughput", unit="tok/s",
                                        judging=Judging(args.min_effect), label=lambda kind, x: f"{label[kind]} {x}")
    latency = {c.point: _latency_note(res["runs"], c) for c in comparisons}
    try:
        device = detect().to_dict()
    except (NoDeviceError, Exception):
        device = {"name": "unknown (no CUDA visible to the client)"}
    settings = {k: (str(val) if isinstance(val, Path) else val) for k, val in vars(v).items()
                if k not in ("model", "configs")}
    settings.update(model_path=str(model.path), load_format=model.load_format or "auto",
                    configs=str(configs.root), tuned_files=list(configs.moe_files),
                    server_args_yaml=str(configs.server_args) if configs.server_args else None,
                    flashinfer_cache=str(configs.flashinfer_cache) if configs.flashinfer_cache else None,
                    parsers=how)
    intro = [f"Engine: SGLang server (`python -m sglang.launch_server`), baseline = SGLang's defaults, "
             f"tuned = `{shown(configs.root)}` ({configs.describe()}).",
             f"Model `{shown(model.path)}` ({'dummy weights' if model.load_format else 'real weights'}), tp {args.tp}; "
             f"{v.repeats} server starts per side in ABBA order; input {v.input_len} / output {v.output_len} tokens; "
             "throughput = `output_throughput` of `sglang.benchmark.serving` (random-ids, fixed lengths) and "
             "`sglang.benchmark.one_batch_server` (single request)."]
    return _finish(args, dict(engine="sglang", device=device, runs=res["runs"], settings=settings,
                              extra={"servers": res["servers"],
                                     "judged": _judged(configs.root, judged, device.get("kind", "unknown"))}),
                   comparisons, out, Report(f"SGLang server, {model.path.name} tp{args.tp}: tuned vs baseline",
                                            "concurrency", intro, configs.folder,
                                            extra_cols={"median ITL ms (baseline / tuned)": latency}))


def _validate_sglang_runs(args) -> int:
    """The gate on runs of SGLang's own code made elsewhere (the lent GPU): three arms per batch,
    each run's log checked for the config file SGLang says it loaded."""
    from autotune.validate import BenchmarkError
    from autotune.validate.judged import snapshot, tree_sha256
    from autotune.validate.report import Report, shown
    from autotune.validate.server_arms import (
        comparisons,
        markdown,
        one_batch_module,
        plot_arms,
        read_runs,
        run_environment,
        table,
    )

    if not args.configs:
        raise ValidateError("--from-runs needs --configs: the tuned folder the runs' tuned arm loaded")
    configs = Path(args.configs)
    tuned = TunedFolder(configs)
    if not tuned.has_provenance():
        raise ValidateError(f"{configs} has no provenance.json: not a tuned folder")
    runs_sha256 = [tree_sha256(src) for src in args.from_runs]
    for i, sha in enumerate(runs_sha256):           # the same runs under two names were counted twice
        if sha in runs_sha256[:i]:
            raise ValidateError(f"--from-runs {args.from_runs[i]} holds the very runs of --from-runs "
                                f"{args.from_runs[runs_sha256.index(sha)]} (the same bytes): name each once")
    out = Path(args.out) if args.out else configs
    _check_out(out, runs_sha256)
    judged = snapshot(configs)
    runs, problems, env = [], [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, src in enumerate(args.from_runs):
            folder = _unpacked(src, Path(tmp) / str(i))
            r, p = read_runs(folder, str(configs))
            runs += r
            problems += p
            env = env or run_environment(folder)
    if problems and any(p.split(":")[0].endswith("_tuned") and "tuned folder" in p for p in problems):
        raise BenchmarkError("a tuned run did not load the tuned folder's files: "     # the one line: each named
                             + "; ".join(p for p in problems if "tuned folder" in p))
    if not any(r.arm == "tuned" for r in runs):
        raise BenchmarkError(f"no tuned run with results in {', '.join(args.from_runs)}"
                             + (f" ({len(problems)} refused: {'; '.join(problems)})" if problems else ""))
    for p in problems:                              # the gate goes on without them: said, not fatal
        print(f"refused: {p}", file=sys.stderr)
    comps = comparisons(runs, "shipped", min_effect=args.min_effect) + \
        comparisons(runs, "default", min_effect=args.min_effect)
    rows = table(runs)
    version = env.get("sglang", "?")
    intro = [f"Engine: **SGLang {version} itself** on {env.get('gpu', '?')} (driver {env.get('driver', '?')}; "
             f"torch {env.get('torch', '?')}, triton {env.get('triton', '?')}): one rank of the model, dummy weights, "
             "three fused-MoE arms per repeat in rotating order: default (no file: SGLang's default config), shipped "
             f"(SGLang's own files), tuned (`{shown(configs)}`).",
             f"bench_one_batch = `python -m {one_batch_module(version)}` (ModelRunner + CUDA graphs: decode step time); "
             "server = `python -m sglang.launch_server` + scripts/sglang_decode_probe.py (decode tokens/s of one "
             "batch of requests through HTTP and the scheduler). Throughput below = batch / step time.",
             "", "Per arm, median ms per decode step (min-max, runs):", "", markdown(rows), "",
             "What SGLang logged it loaded (first run of each arm):", ""]
    for arm in ("default", "shipped", "tuned"):
        first = next((r for r in runs if r.arm == arm), None)
        if first:
            intro += [f"- {arm} ({first.name}):"] + [f"  - `{line[:300]}`" for line in first.evidence.lines]
    settings = {"runs": list(args.from_runs), "runs_sha256": runs_sha256, "configs": str(configs), "sglang": version,
                "command": "autotune " + " ".join(sys.argv[1:])}
    report = Report(f"SGLang {version}: tuned vs shipped and default", "decode batch size", intro,
                    tuned,
                    plotter=lambda path: plot_arms(path, rows, title=f"SGLang {version}, one rank, dummy weights"))
    return _finish(args, dict(engine=f"sglang-server {version}", device=env, runs=[r.to_dict() for r in runs],
                              settings=settings,
                              extra={"arms_table": rows, "refused_runs": problems,
                                     "judged": _judged(configs, judged, "gpu" if env.get("gpu") else "unknown")}),
                   comps, out, report)


def _unpacked(src: str, into: Path) -> Path:
    """A runs folder, or the tarball the device call brought back (its one folder inside)."""
    import tarfile

    from autotune.validate import BenchmarkError
    p = Path(src)
    if not p.is_file():
        return p
    try:
        with tarfile.open(p) as t:
            t.extractall(into, filter="data")
    except (tarfile.TarError, OSError) as e:
        raise BenchmarkError(f"{p}: not a readable runs tarball ({e})") from None
    inner = [d for d in into.iterdir() if d.is_dir()]
    return inner[0] if len(inner) == 1 else into


def _latency_note(runs: list[dict], c) -> str:
    import statistics

    key = "median_itl_ms"
    vals = {}
    for side in ("baseline", "tuned"):
        xs = [r["metrics"].get(key) for r in runs if r["x"] == c.x and r["side"] == side
              and c.point.startswith("concurrency" if r["kind"] == "serving" else "single")]
        xs = [x for x in xs if isinstance(x, (int, float))]
        vals[side] = f"{statistics.median(xs):.2f}" if xs else "-"
    return f"{vals['baseline']} / {vals['tuned']}"


# --- harness ---------------------------------------------------------------------------------------

def _validate_harness(args) -> int:
    from autotune.problems import models
    from autotune.adapters.local_gpu import detect
    from autotune.gpus.device import NoDeviceError, cpu_interpreter
    from autotune.validate.gate import Judging, comparisons_from_runs
    from autotune.validate.harness import HarnessModel, HarnessSettings, on_interpreter, run_harness
    from autotune.validate.judged import snapshot
    from autotune.validate.report import Report, shown

    if args.concurrencies:
        raise ValidateError("--concurrencies is for --engine sglang; the harness takes --batch-sizes")
    if args.model_path:
        raise ValidateError("--model-path is for --engine sglang; the harness takes --model or --model-config")
    if bool(args.model) == bool(args.model_config):
        raise ValidateError("--engine harness needs one of --model NAME (e.g. qwen3.5-397b-a17b) or --model-config")
    if args.dtype not in models.TRITON_DTYPES:
        raise ValidateError(f"--dtype must be one of {', '.join(models.TRITON_DTYPES)}")
    hm = (HarnessModel.preset(models.select_models(model=args.model)[0]) if args.model
          else HarnessModel.from_config(args.model_config))
    batch_sizes = _ints(args.batch_sizes, "--batch-sizes")
    on_cpu = on_interpreter()
    if on_cpu:
        device = cpu_interpreter()
    else:
        try:
            device = detect()
        except NoDeviceError:
            raise HarnessError("no GPU visible: the harness times a GPU (for the CPU pipeline check run it "
                               "under TRITON_INTERPRET=1)") from None
    configs = Path(args.configs or Path("tuned_configs") / device.file_name)
    if not configs.is_dir():
        raise HarnessError(f"tuned configs folder {configs} does not exist (pass --configs tuned_configs/<device>)")
    out = Path(args.out) if args.out else configs
    _check_out(out)
    judged = snapshot(configs)
    res = run_harness(hm, HarnessSettings(args.tp, device, configs, tuple(batch_sizes), repeats=args.repeats or 5,
                                          layers=args.layers, dtype=args.dtype, on_cpu=on_cpu))
    desc = res["description"]
    comparisons = comparisons_from_runs(res["runs"], "tokens_per_s", unit="tok/s", judging=Judging(args.min_effect),
                                        label=lambda kind, x: f"batch {x}")
    share = {}
    for c in comparisons:
        sh = {side: sorted(r["metrics"]["moe_share"] for r in res["runs"] if r["x"] == c.x and r["side"] == side)
              for side in ("baseline", "tuned")}
        share[c.point] = " / ".join(f"{v[len(v) // 2]:.0%}" for v in sh.values())
    label = "harness, not a model" + (" (cpu-interpreter wall clock: not a speed)" if on_cpu else "")
    intro = [f"Engine: **{label}**. {desc['layers_timed']} layers of {desc['model']} at tp{desc['tp']} per-rank "
             f"shapes ({', '.join(desc['layer_kinds'])}), random weights, scaled to {desc['layers_model']} layers; "
             f"fused MoE {hm.model.num_experts} experts through SGLang's `invoke_fused_moe_kernel`: default = "
             f"SGLang's built-in configs, tuned = `{shown(configs)}`.",
             f"Timing: {desc['timing']}. Not in the step: {', '.join(desc['not_modelled'])}.",
             *[f"Note: {n}" for n in desc["notes"]]]
    moe_rows = moe_table(res["moe_by_side"])
    intro += ["", f"The fused MoE of one layer per batch, SGLang's call sequence as composed here (gate_up, "
              f"activation, down; {'interpreter wall clock' if on_cpu else 'CUDA graph, L2 flushed'}), median "
              "µs over the repeats (spread):", "", moe_markdown(moe_rows)]
    settings = {"model": desc["model"], "tp": args.tp, "dtype": args.dtype, "batch_sizes": list(batch_sizes),
                "repeats": args.repeats or 5, "layers": desc["layers_timed"], "configs": str(configs),
                "command": "autotune " + " ".join(sys.argv[1:])}
    return _finish(args, dict(engine="harness", device=device.to_dict(), runs=res["runs"], settings=settings,
                              extra={"harness": desc, "configs_used": _jsonable(res["configs"]),
                                     "reference_errors": _jsonable(res["checks"]), "moe_per_batch": moe_rows,
                                     "judged": _judged(configs, judged, device.kind)}),
                   comparisons, out, Report(f"{label}: {desc['model']} tp{desc['tp']}, tuned vs default",
                                            "decode batch size", intro, TunedFolder(configs),
                                            extra_cols={"MoE share of step (default / tuned)": share}))


MOE_SIDES = (("heuristic", "SGLang default (no file)"), ("default", "SGLang's folder (shipped)"), ("tuned", "tuned"))


def moe_table(moe_by_side: dict) -> list[dict]:
    """Per batch: median and spread ((max - min) / median) of each side's MoE time, and tuned's
    speed-up over the other two (other / tuned - 1)."""
    rows = []
    for M, sides in sorted(moe_by_side.items()):
        row = {"batch": M}
        for side, _ in MOE_SIDES:
            xs = sorted(sides.get(side) or [])
            med = xs[len(xs) // 2] if xs else None
            row[side] = {"median_us": med, "spread": (xs[-1] - xs[0]) / med if med else None, "n": len(xs)}
        tuned = row["tuned"]["median_us"]
        for side in ("default", "heuristic"):
            other = row[side]["median_us"]
            row[f"tuned_vs_{side}"] = other / tuned - 1 if tuned and other else None
        rows.append(row)
    return rows


def moe_markdown(rows: list[dict]) -> str:
    head = "| batch | " + " | ".join(f"{name} µs" for _, name in MOE_SIDES) + " | tuned vs shipped | tuned vs default |"
    out = [head, "|" + "---|" * (len(MOE_SIDES) + 3)]
    for r in rows:
        cells = [f"{r[s]['median_us']:.1f} ({r[s]['spread']:.0%})" if r[s]["median_us"] else "-" for s, _ in MOE_SIDES]
        gains = [f"{r[k]:+.1%}" if r[k] is not None else "-" for k in ("tuned_vs_default", "tuned_vs_heuristic")]
        out.append(f"| {r['batch']} | " + " | ".join(cells + gains) + " |")
    return "\n".join(out)


def _jsonable(d: dict) -> dict:
    return {str(k): v for k, v in d.items()}
