"""The `autotune` command line: every subcommand's flags (the commands live in cli.py and cli_folder.py)."""
from __future__ import annotations

from autotune.contract import registry
from autotune.cli import inputs
from autotune.cli.common import add_selection
from autotune.problems.models import MAX_BATCH

# Upper bounds of the search and device flags: far above any useful value, below the ones that
# ran for ever or overflowed (issue 23's sweep took 1e30 trials, 1e300 skew and 1e9 routings).
MAX_TRIALS = 100_000        # SGLang's whole grid is 3840 configs a GEMM: more trials ask nothing new
MAX_NEIGHBOURS = 64         # more than a batch list holds: every M is already a neighbour
MAX_ROUTINGS = 1000         # one M x E routing tensor each, held on the GPU; a graph replays a few dozen
MAX_SKEW = 100.0            # std devs: past ~30 the routing no longer changes; 1e300 became inf (NaN routings)
MAX_SEED = 2**32 - 1        # numpy's and Optuna's seed range (the kernels' torch seeds are multiples of it)
MAX_WORKERS = 15 * 16       # 15 a GPU (run_open refuses more per GPU) on a 16-GPU host
MAX_BUILDERS = 256          # CPU processes, one core each: a large host's cores
MAX_HEARTBEAT = 3600        # seconds: a dead worker's trial waits 3 heartbeats before it is re-queued


def _add_search_args(p) -> None:
    g = p.add_argument_group("search")
    g.add_argument("--trials", type=inputs.count(1, MAX_TRIALS), help="measured trials per (GEMM, M) study (default 40)")
    g.add_argument("--neighbours", type=inputs.count(0, MAX_NEIGHBOURS), default=1, help="also measure each trial at this many adjacent M")
    g.add_argument("--no-shipped", action="store_true", help="do not seed with SGLang's shipped configs")
    g.add_argument("--study", type=inputs.path, help="run name the studies are filed under (default: the GPU's name)")
    g.add_argument("--quiet", action="store_true", help="no progress bar")
    g.add_argument("--warm-start", metavar="SOURCE", type=inputs.path,
                   help="begin each new study with the best configs of another GPU's or shape's study: a "
                        "measurement cache (--record file) or an Optuna storage URL holding triton_moe studies")
    g.add_argument("--sglang-version", metavar="VERSIONS",
                   help="SGLang release(s) that will load the files: 0.5.16, a list 0.5.16,0.5.23 or a range "
                        "0.5.16-0.5.23 (default: the installed one); configs an older release cannot run "
                        "(up-projection USE_TMA before 0.5.18) are never chosen")


def _add_storage_and_out(p) -> None:
    p.add_argument("--storage", type=inputs.storage_url, help="Optuna storage URL (default sqlite:///autotune.db)")
    p.add_argument("--out", type=inputs.path, help="folder for SGLang's files (default tuned_configs; with --replay tuned_configs/replay)")
    p.add_argument("--device-name", action="append", metavar="NAME",
                   help="also write the tuned files under another SKU's name of the same chip, as "
                        "torch.cuda.get_device_name() prints it (repeatable), e.g. 'NVIDIA RTX PRO 6000 Blackwell "
                        "Workstation Edition'; marked in provenance as measured on another SKU")


def _add_device_args(p) -> None:
    g = p.add_argument_group("device")
    g.add_argument("--replay", help="replay a recorded measurement cache instead of using a GPU (several "
                   "recordings of one GPU model: comma-separated, merged)")
    g.add_argument("--gpus", type=inputs.gpus, default="0", help="GPU indices to use, or 'all'")
    g.add_argument("--workers", type=inputs.count(1, MAX_WORKERS), help="measuring processes (each a CUDA context); "
                   "default one a GPU where the kernels compile apart (Triton), else as many as fit (max 15/GPU)")
    g.add_argument("--builders", type=inputs.count(1, MAX_BUILDERS), help="CPU processes that compile Triton kernels "
                   "for the GPU apart from measuring; default cores - 1 - workers")
    g.add_argument("--timeout", type=inputs.number(positive=True, most=inputs.MAX_SECONDS), default=300.0, help="seconds without progress before a trial is killed")
    g.add_argument("--seed", type=inputs.count(0, MAX_SEED), default=0)
    g.add_argument("--skew", type=inputs.number(0, most=MAX_SKEW), default=0.0, help="routing skew: per-expert logit bias in std devs (0 = uniform)")
    g.add_argument("--routings", type=inputs.count(1, MAX_ROUTINGS), default=10, help="routing sets per timed graph")
    g.add_argument("--log-level", choices=("warning", "info", "debug"), default="info",
                   help="warning: no progress bars; debug: Optuna's own log and the workers' output on the terminal")
    g.add_argument("--worker-log", metavar="FILE", type=inputs.path,
                   help="where measurement processes write (compiler dumps, full errors); default a new file "
                        "in the temp folder, named at the start")
    g.add_argument("--replay-realtime", type=inputs.number(0, most=100.0), default=0.0,
                   help="with --replay: answer after this many x the recorded device seconds (tests)")
    p.needs("--replay-realtime", "--replay", "it paces a replay's answers")


def _version() -> str:
    import importlib.metadata as md
    try:
        return md.version("autotune")
    except md.PackageNotFoundError:
        return "(not installed)"


def build_parser(commands: dict) -> inputs.Parser:
    """The parser of every subcommand; `commands`: subcommand -> the function that runs it (cli.py)."""
    ap = inputs.Parser(prog="autotune", description="Tune SGLang's MoE kernels for this GPU.")
    ap.add_argument("--version", action="version", version=f"autotune {_version()}")
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name, add_flags in _COMMANDS:
        add_flags(sub, commands[name])
    from autotune.cli.validate import add_parser as add_validate_parser
    add_validate_parser(sub)   # `autotune validate`: end-to-end decode throughput, default vs tuned
    return ap


def _shapes(sub, fn) -> None:
    p = sub.add_parser("shapes", help="print the problems a run would tune")
    add_selection(p)
    p.add_argument("--target-sm", type=inputs.sm, action="append",
                   help="also show how many configs each architecture admits (repeatable: 90, 100, 120)")
    p.set_defaults(fn=fn)


def _run(sub, fn) -> None:
    p = sub.add_parser("run", help="tune, select, export SGLang's config files")
    models = add_selection(p)
    _add_device_args(p)
    _add_search_args(p)
    p.add_argument("--budget", type=inputs.seconds, help="device time for the whole run, e.g. 20m (a unit is needed: 90s, 20m, 1.5h)")
    p.add_argument("--dry-run", action="store_true",
                   help="say what would be tuned and the estimated device time, measure and write nothing")
    p.add_argument("--target-device", metavar="NAME", type=inputs.path,
                   help="with --dry-run: plan for this GPU model (as torch.cuda.get_device_name() prints it, e.g. "
                        "'NVIDIA H200'), on any machine; default: the GPU here")
    _add_storage_and_out(p)
    p.add_argument("--record", type=inputs.path, help="also write every measurement to this cache file")
    p.add_argument("--json", metavar="FILE", type=inputs.path, help="also write a machine-readable summary of the run here")
    models.add_argument("--only-drifted", metavar="FOLDER", type=inputs.path,
                        help="re-tune only the files of this exported folder that `autotune check` calls drifted "
                             "(another GPU or Triton, or an SGLang release in --sglang-version they do not run in); "
                             "the problems come from its provenance, the files go back into it")
    p.excludes("--only-drifted", ("--tp", "--ep", "--dtype", "--batch-sizes"),
               "the folder's provenance names the problems and batch sizes it re-tunes")
    p.needs("--target-device", "--dry-run", "it plans a run for a GPU model; a run measures on the GPU it finds")
    p.excludes("--target-device", ("--replay",), "both name the device")
    _run_backends(p)
    inputs.add_force(p)
    p.set_defaults(fn=fn)


def _run_backends(p) -> None:
    """`autotune run`'s flags of the kernel families and the backend choice."""
    p.add_argument("--kernels", default="all",
                   help=f"kernel families: {', '.join(registry.names())}, or all (default: all that this GPU supports)")
    p.add_argument("--mix", choices=("decode", "prefill"), default="decode",
                   help="batch-size mix the one-backend-per-server choice optimises (default decode)")
    p.add_argument("--skip-backends", metavar="NAMES",
                   help="backends never launched: NAME in every family, FAMILY:NAME in one (e.g. "
                        "moe_bf16:flashinfer_cutlass where its CUTLASS MoE JIT build is not cached yet)")
    p.add_argument("--checkpoint", choices=registry.with_flag("moe-runner-backend"),
                   help="which MoE family's runner goes into server_args.yaml (default: the first measured)")


def _worker(sub, fn) -> None:
    p = sub.add_parser("worker", help="search a study shared with other workers (e.g. on PostgreSQL)")
    add_selection(p)
    _add_device_args(p)
    _add_search_args(p)
    p.add_argument("--storage", required=True, type=inputs.storage_url, help="shared Optuna storage URL, e.g. postgresql://...")
    p.add_argument("--gpu", dest="gpus", type=inputs.gpus, default="0", help="the GPU this worker measures on")
    p.add_argument("--heartbeat", type=inputs.count(1, MAX_HEARTBEAT), default=10,
                   help="seconds between heartbeats; a worker silent for 3 is declared dead")
    p.add_argument("--budget", type=inputs.seconds, help="stop asking after this much device time, e.g. 20m")
    p.set_defaults(fn=fn)


def _export(sub, fn) -> None:
    p = sub.add_parser("export", help="select and write SGLang's files from a (shared) study")
    add_selection(p)
    _add_device_args(p)
    _add_search_args(p)
    _add_storage_and_out(p)
    p.add_argument("--partial", action="store_true", help="export a study short of its trial budget")
    inputs.add_force(p)
    p.set_defaults(fn=fn)


def _publish(sub, fn) -> None:
    p = sub.add_parser("publish", help="commit tuned configs into a serving repo, on a new branch")
    p.add_argument("--to", required=True, type=inputs.path, help="serving repo: a local working tree, or a git URL to clone and push")
    p.add_argument("--from", dest="src", type=inputs.path, help="tuned folder (default: the one under tuned_configs/)")
    p.add_argument("--branch", help="new branch (default tuned/<device>)")
    p.add_argument("--path", type=inputs.path, help="folder inside the serving repo (default tuned_configs/<device>)")
    inputs.add_force(p)
    p.set_defaults(fn=fn)


def _record(sub, fn) -> None:
    p = sub.add_parser("record", help="measure a whole search space into a measurement cache")
    add_selection(p)
    _add_device_args(p)
    p.add_argument("--cache", required=True, type=inputs.path, help="cache file to extend (resumes: measured keys are skipped)")
    p.add_argument("--budget", type=inputs.seconds, help="stop submitting after this much wall time, e.g. 8m")
    p.add_argument("--shard", type=inputs.shard, help="i/n: take every n-th config starting at i")
    p.add_argument("--quiet", action="store_true")
    inputs.add_force(p)
    p.set_defaults(fn=fn)


def _merge_caches(sub, fn) -> None:
    p = sub.add_parser("merge-caches", help="merge partial recordings of one device")
    p.add_argument("caches", nargs="+", type=inputs.path, action=inputs.DistinctPaths)
    p.add_argument("-o", "--output", required=True, type=inputs.path)
    inputs.add_force(p)
    p.set_defaults(fn=fn)


def _merge_choices(sub, fn) -> None:
    p = sub.add_parser("merge-choices", help="fold the backend choices of other runs on this GPU model into "
                                             "one server_args.yaml")
    p.add_argument("sources", nargs="+", type=inputs.path, action=inputs.DistinctPaths, help="tuned folders (<out>/<device>) or backend_choice.json files")
    p.add_argument("--out", default="tuned_configs", type=inputs.path, help="folder holding <device>/server_args.yaml")
    inputs.add_force(p)
    p.set_defaults(fn=fn)


def _compile_limits(sub, fn) -> None:
    p = sub.add_parser("compile-limits", help="compile every config of an architecture's space for it (no GPU "
                                              "needed) and record the exact shared memory each needs")
    add_selection(p)
    p.add_argument("--target-sm", type=inputs.sm, required=True, help="architecture, e.g. 120 (RTX PRO 6000) or 100 (B200)")
    p.add_argument("--out", type=inputs.path, help="record file (default search_spaces/compiled/sm<XY>.json)")
    inputs.add_force(p)
    p.set_defaults(fn=fn)


def _check(sub, fn) -> None:
    p = sub.add_parser("check", help="does a tuned folder still match this machine: SGLang release, GPU, Triton?")
    p.add_argument("folder", type=inputs.path, help="tuned folder, e.g. tuned_configs/NVIDIA_H200")
    p.add_argument("--sglang-version", metavar="VERSIONS",
                   help="the serving SGLang release(s) (default: the one installed here)")
    p.add_argument("--no-retime", action="store_true",
                   help="on a GPU, compare versions only: do not re-time the files against SGLang's shipped and "
                        "default configs")
    p.add_argument("--batch-sizes", default=None, type=inputs.int_list(MAX_BATCH),
                   help="batch sizes to re-time (default: 1, 32, 256, 4096 where the file holds them)")
    p.excludes("--no-retime", ("--batch-sizes",), "--batch-sizes are the ones re-timed")
    p.set_defaults(fn=fn)


def _install(sub, fn) -> None:
    p = sub.add_parser("install", help="put a tuned folder's FlashInfer tactics cache where SGLang reads it at "
                                       "start-up (one identical file per rank)")
    p.add_argument("folder", type=inputs.path, help="tuned folder holding flashinfer_autotune_cache.json")
    p.add_argument("--model-path", required=True, type=inputs.path, help="the server's --model-path, exactly as given to it")
    # one rank file per GPU: bounded here; install bounds them by the model's heads and experts, and
    # checks the names below against the installed SGLang's own lists (importing it is too slow here)
    gpus = inputs.count(1, inputs.MAX_GPUS)
    p.add_argument("--tp", type=gpus, required=True, help="the server's --tp")
    p.add_argument("--pp", type=gpus, default=1, help="the server's --pp (default 1)")
    p.add_argument("--attn-dp", type=gpus, default=1, help="attention data-parallel size (default 1)")
    p.add_argument("--ep", type=gpus, default=1, help="the server's MoE expert-parallel size (default 1)")
    p.add_argument("--dtype", default="bfloat16", help="the model dtype the server resolves, one of SGLang's "
                                                       "--dtype values but auto (default bfloat16)")
    p.add_argument("--quantization", help="SGLang's resolved quantization, one of its --quantization values "
                                          "('none' for none; default: read from the model folder's config.json)")
    p.add_argument("--moe-runner-backend", help="as the server resolves it, one of SGLang's --moe-runner-backend "
                                                "values (default: the folder's server_args.yaml)")
    p.add_argument("--hf-config-class", help="transformers' (or SGLang's) config class (default: read from the "
                                             "model folder)")
    p.add_argument("--skip-ops", default="", help="the server's --flashinfer-autotune-skip-ops, comma separated")
    p.add_argument("--cache-dir", type=inputs.path, help="SGLANG_CACHE_DIR of the server (default: $SGLANG_CACHE_DIR or ~/.cache/sglang)")
    inputs.add_force(p)
    p.set_defaults(fn=fn)


def _rank_model(sub, fn) -> None:
    p = sub.add_parser("rank-model", help="write a config-only model folder of one tensor-parallel rank "
                                          "(SGLang serves it on one GPU with --load-format dummy)")
    models = p.add_mutually_exclusive_group()
    models.add_argument("--model", help="a Qwen3.5 preset, e.g. qwen3.5-397b-a17b")
    models.add_argument("--model-config", type=inputs.path, help="any HF config.json (or its folder)")
    p.add_argument("--tp", type=inputs.count(1, inputs.MAX_GPUS), required=True,
                   help="the deployment's tensor-parallel size")
    p.add_argument("--layers", type=inputs.count(1), help="keep only this many of the model's layers (default: all)")
    p.add_argument("--fp8-block", action="store_true", help="declare a block-FP8 checkpoint ([128, 128] blocks)")
    p.add_argument("--out", required=True, type=inputs.path, help="folder to write")
    inputs.add_force(p)
    p.set_defaults(fn=fn)


# Each subcommand with the function adding its flags, in the order `autotune --help` lists them.
_COMMANDS = (("shapes", _shapes), ("run", _run), ("worker", _worker), ("export", _export), ("publish", _publish),
             ("record", _record), ("merge-caches", _merge_caches), ("merge-choices", _merge_choices),
             ("compile-limits", _compile_limits), ("check", _check), ("install", _install),
             ("rank-model", _rank_model))
