"""`autotune` commands that measure nothing: shapes, check, compile-limits, rank-model, publish,
merge-caches, merge-choices."""
from __future__ import annotations

import json
import os
from pathlib import Path

from .errors import UsageError
from .run_common import print_shared, problems


# --- shapes ----------------------------------------------------------------------------------

def cmd_shapes(args) -> int:
    from . import device as devmod
    from .kernels import get_family

    exp = problems(args)
    fam = get_family("triton_moe", space_path=args.search_space)
    targets = [devmod.planned(sm) for sm in (args.target_sm or [])]
    print(f"{len(exp.problems)} fused-MoE problems; batch sizes {','.join(map(str, exp.problems[0].batch_sizes))}"
          if exp.problems else "no problems")
    header = f"{'E':>5} {'N':>5} {'K':>5} {'top_k':>5} {'dtype':<15} {'ep':>3}  used by"
    if targets:
        header += "".join(f"  | sm{t.sm} admits (gate_up/down of grid)" for t in targets)
    print(header)
    for p in exp.problems:
        mtp = {(s[0], s[1], s[2]) for s in p.sources if s[3] == "mtp"}
        used = ", ".join(f"{m} tp{tp}" + (f" ep{ep}" if ep > 1 else "") + (" +MTP" if (m, tp, ep) in mtp else "")
                         for m, tp, ep, kind in p.sources if kind == "main")
        line = f"{p.E:>5} {p.N:>5} {p.K:>5} {p.top_k:>5} {p.dtype:<15} {p.ep:>3}  {used}"
        for t in targets:
            why = fam.unsupported_reason(p, t)
            if why:
                line += f"  | unsupported: {why}"
                continue
            counts = []
            for g in fam.gemms:
                space = fam.space(p, g, t)
                ok = sum(1 for c in space.configs() if fam.check(c, p, g, t) is None)
                counts.append(f"{ok}/{space.size()}")
            line += f"  | {' / '.join(counts)}"
        print(line)
    print_shared(exp)
    from .kernels.cross_compile import COMPILED_DIR, load
    for t in targets:
        rec = load(t.sm)
        print(f"sm{t.sm}: shared memory " + (f"exact, compiled with Triton {rec['triton']} ({len(rec['records'])} configs, "
                                             f"{COMPILED_DIR.name}/sm{t.sm}.json)" if rec else
                                             "estimated (autotune compile-limits --target-sm "
                                             f"{t.sm} records exact limits)"))
    try:
        here = devmod.detect()
        print(f"this machine: {here.name} (SM{here.sm}); SGLang names its files device_name={here.file_name}")
    except devmod.NoDeviceError:
        print("this machine: no GPU visible (SGLang's device_name is torch.cuda.get_device_name() with spaces as _)")
    return 0



def cmd_publish(args) -> int:
    from .publish import PublishError, publish

    src = Path(args.src) if args.src else None
    if src is None:
        found = [d for d in Path("tuned_configs").glob("*") if (d / "provenance.json").exists()]
        if len(found) != 1:
            raise UsageError("say which tuned folder to publish with --from (found "
                             f"{', '.join(str(d) for d in found) or 'none'} under tuned_configs/)")
        src = found[0]
    try:
        out = publish(src, args.to, args.branch or f"tuned/{src.name}", args.path)
    except PublishError as e:
        raise UsageError(str(e))
    print(f"published {src} to {args.to} on branch {out.branch} ({out.commit[:12]}), {len(out.files)} files")
    for name, kept in out.kept.items():
        for M, why in kept.items():
            print(f"  {name} M={M}: {why}")
    return 0



def cmd_merge(args) -> int:
    from .fsutil import claim
    from .records import CACHE_OURS, CacheError, merge_caches, write_cache

    claim(args.output, CACHE_OURS, "-o")     # a file there must be a measurement cache (it is replaced)
    try:
        cache = merge_caches(args.caches)
    except CacheError as e:
        raise UsageError(str(e))
    write_cache(args.output, cache)
    print(f"merged {len(args.caches)} caches: {len(cache.records)} measurements -> {args.output}")
    return 0


def cmd_install(args) -> int:
    """The folder's FlashInfer cache into every rank's file of SGLang's cache for this server."""
    from .export.install import InstallError, blocklist_hint, install

    given = args.quantization is not None
    quant = None if (args.quantization or "").lower() == "none" else args.quantization
    try:
        paths = install(args.folder, model_path=args.model_path, tp=args.tp, pp=args.pp, attn_dp=args.attn_dp,
                        ep=args.ep, dtype=args.dtype, quantization=quant, quantization_given=given,
                        moe_runner_backend=args.moe_runner_backend, hf_config_class=args.hf_config_class,
                        cache_dir=args.cache_dir, skip_ops=[s for s in args.skip_ops.split(",") if s])
    except InstallError as e:
        raise UsageError(str(e)) from None
    print(f"installed the tactics of {args.folder} for {len(paths)} rank(s), identical files:")
    for path in paths:
        print(f"  {path}")
    hint = blocklist_hint(args.folder)
    if hint:
        print(f"and before starting the server: {hint}")
    return 0


def cmd_rank_model(args) -> int:
    """A config-only model folder of one TP rank, for SGLang's server with --tp 1 --load-format dummy."""
    from . import models
    from .validate.rank_model import qwen35_hf_config, write_rank_model

    if bool(args.model) == bool(args.model_config):
        raise UsageError("rank-model needs one of --model NAME or --model-config FILE")
    if args.model_config:
        models.model_from_hf_config(args.model_config)      # validated once; the rank keeps every other key
    hf = (models.read_hf_config(args.model_config) if args.model_config
          else qwen35_hf_config(models.select_models(model=args.model)[0]))
    folder = write_rank_model(args.out, hf, args.tp, args.layers, args.fp8_block)
    text = json.loads((folder / "config.json").read_text())
    text = text.get("text_config", text)
    print(f"wrote {folder}: one tp{args.tp} rank, {text.get('num_hidden_layers')} layers, experts "
          f"{text.get('num_experts')} x moe_intermediate_size {text.get('moe_intermediate_size')}; serve it with "
          "--tp 1 --load-format dummy")
    return 0


def cmd_compile_limits(args) -> int:
    """Compile every config of an architecture's space for it, here (no GPU needed), and record
    what each needs: the exact limits `check` then uses for that architecture."""
    from . import device as devmod
    from .kernels import get_family
    from .kernels.cross_compile import record

    try:
        devmod.planned(args.target_sm)
    except devmod.NoDeviceError as e:
        raise UsageError(str(e)) from None
    from .fsutil import claim, json_with
    from .kernels.cross_compile import COMPILED_DIR
    claim(Path(args.out) if args.out else COMPILED_DIR / f"sm{args.target_sm}.json", json_with("sm", "records"), "--out")
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise UsageError("TRITON_INTERPRET=1 is set: Triton's interpreter compiles nothing; unset it for compile-limits")
    exp = problems(args)
    fam = get_family("triton_moe", space_path=args.search_space)
    path = record(args.target_sm, [p for p in exp.problems if fam.unsupported_reason(p, devmod.planned(args.target_sm))
                                   is None], fam, Path(args.out) if args.out else None)
    print(f"wrote {path}")
    return 0


def cmd_check(args) -> int:
    from . import device as devmod
    from .check import CheckError, check_folder

    Ms = args.batch_sizes                 # parsed by the flag's type (autotune.inputs)
    try:
        machine = devmod.detect()
    except devmod.NoDeviceError:
        machine = None
    try:
        # re-timing runs SGLang's kernels: on a CUDA GPU only, unless told not to
        code, lines = check_folder(args.folder, args.sglang_version, machine, batch_sizes=Ms,
                                   retime_gpu=machine is not None and machine.kind == "gpu" and not args.no_retime)
    except CheckError as e:
        raise UsageError(str(e)) from None
    for line in lines:
        print(line)
    print("fresh: the folder matches this machine" if code == 0 else "drifted: re-tune or re-export (see above)")
    return code


def cmd_merge_choices(args) -> int:
    from .export import server_args

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file; name the folder that holds <device>/server_args.yaml")
    try:
        server_args.check_merge(args.sources, args.out)      # every source, before anything is written
        for src in args.sources:
            path = server_args.merge_folder(src, args.out)
    except server_args.ChoicesError as e:
        raise UsageError(str(e)) from None
    print(f"merged the backend choices of {', '.join(args.sources)} -> {path}")
    return 0
