"""The commands that measure nothing, as library calls: shapes, check, compile-limits,
publish, merge-caches, merge-choices. Each takes its flags as keyword arguments (a selection of what
to tune as `sel`, an api.TuneRequest; install's server as `server`, an
export.install.ServerFlags) and returns the lines the command prints; bad input raises
UsageError. The `autotune` command (cli_folder.py) only passes the flags and prints."""
from __future__ import annotations

import json
import os
from pathlib import Path

from autotune.errors import UsageError
from autotune.contract import registry
from autotune.problems.selection import problems, shared_notes
from autotune.folder.tuned import TunedFolder


# --- shapes ----------------------------------------------------------------------------------

def shapes(sel, target_sm=None) -> list[str]:
    lines: list[str] = []
    from autotune.adapters import local_gpu
    from autotune.gpus import device as devmod
    from autotune.contract.protocol import get_family

    exp = problems(sel)
    fam = get_family(registry.default(), space_path=sel.search_space)
    targets = [devmod.planned(sm) for sm in (target_sm or [])]
    lines.append(f"{len(exp.problems)} fused-MoE problems; batch sizes {','.join(map(str, exp.problems[0].batch_sizes))}"
          if exp.problems else "no problems")
    header = f"{'E':>5} {'N':>5} {'K':>5} {'top_k':>5} {'dtype':<15} {'ep':>3}  used by"
    if targets:
        header += "".join(f"  | sm{t.sm} admits (gate_up/down of grid)" for t in targets)
    lines.append(header)
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
        lines.append(line)
    lines += shared_notes(exp)
    from autotune.families.triton_moe.cross_compile import COMPILED_DIR, load
    for t in targets:
        rec = load(t.sm)
        lines.append(f"sm{t.sm}: shared memory " + (f"exact, compiled with Triton {rec['triton']} ({len(rec['records'])} configs, "
                                             f"{COMPILED_DIR.name}/sm{t.sm}.json)" if rec else
                                             "estimated (autotune compile-limits --target-sm "
                                             f"{t.sm} records exact limits)"))
    try:
        here = local_gpu.detect()
        lines.append(f"this machine: {here.name} (SM{here.sm}); SGLang names its files device_name={here.file_name}")
    except devmod.NoDeviceError:
        lines.append("this machine: no GPU visible (SGLang's device_name is torch.cuda.get_device_name() with spaces as _)")
    return lines


def publish(to, src=None, branch=None, path=None) -> list[str]:
    from autotune.errors import mask_credentials
    from autotune.publish import PublishError, device_folder, publish as publish_folder

    lines: list[str] = []

    src = Path(src) if src else None
    if src is None:
        found = [d for d in Path("tuned_configs").glob("*") if TunedFolder(d).has_provenance()]
        if len(found) != 1:
            raise UsageError("say which tuned folder to publish with --from (found "
                             f"{', '.join(str(d) for d in found) or 'none'} under tuned_configs/)")
        src = found[0]
    try:
        out = publish_folder(src, to, branch or f"tuned/{device_folder(src)}", path)
    except PublishError as e:
        raise UsageError(str(e))
    lines.append(f"published {src} to {mask_credentials(to)} on branch {out.branch} ({out.commit[:12]}), {len(out.files)} files")
    for name, kept in out.kept.items():
        for M, why in kept.items():
            lines.append(f"  {name} M={M}: {why}")
    return lines


def merge_caches(caches, output) -> list[str]:
    from autotune.fileio.writing import claim
    from autotune.measure.records import CACHE_OURS, CacheError, merge_caches as merged, write_cache

    lines: list[str] = []

    claim(output, CACHE_OURS, "-o")     # a file there must be a measurement cache (it is replaced)
    try:
        cache = merged(caches)
    except CacheError as e:
        raise UsageError(str(e))
    write_cache(output, cache)
    lines.append(f"merged {len(caches)} caches: {len(cache.records)} measurements -> {output}")
    return lines


def install(folder, server, cache_dir=None) -> list[str]:
    """The folder's FlashInfer cache into every rank's file of SGLang's cache for this server
    (`server`: an export.install.ServerFlags)."""
    from autotune.export.install import InstallError, blocklist_hint, install

    lines: list[str] = []
    try:
        paths = install(folder, server, cache_dir)
    except InstallError as e:
        raise UsageError(str(e)) from None
    lines.append(f"installed the tactics of {folder} for {len(paths)} rank(s), identical files:")
    for path in paths:
        lines.append(f"  {path}")
    hint = blocklist_hint(folder)
    if hint:
        lines.append(f"and before starting the server: {hint}")
    return lines


def compile_limits(sel, target_sm, out=None) -> list[str]:
    """Compile every config of an architecture's space for it, here (no GPU needed), and record
    what each needs: the exact limits `check` then uses for that architecture."""
    lines: list[str] = []
    from autotune.gpus import device as devmod
    from autotune.contract.protocol import get_family
    from autotune.families.triton_moe.cross_compile import record

    try:
        devmod.planned(target_sm)
    except devmod.NoDeviceError as e:
        raise UsageError(str(e)) from None
    from autotune.fileio.writing import claim, json_with
    from autotune.families.triton_moe.cross_compile import COMPILED_DIR
    claim(Path(out) if out else COMPILED_DIR / f"sm{target_sm}.json", json_with("sm", "records"), "--out")
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise UsageError("TRITON_INTERPRET=1 is set: Triton's interpreter compiles nothing; unset it for compile-limits")
    exp = problems(sel)
    fam = get_family(registry.default(), space_path=sel.search_space)
    path = record(target_sm, [p for p in exp.problems if fam.unsupported_reason(p, devmod.planned(target_sm))
                                   is None], fam, Path(out) if out else None)
    lines.append(f"wrote {path}")
    return lines


def check(folder, sglang_version=None, batch_sizes=None, no_retime=False) -> tuple[int, list[str]]:
    from autotune.adapters import local_gpu
    from autotune.gpus import device as devmod
    from autotune.families.triton_moe.retime import retime
    from autotune.folder.check import CheckError, check_folder

    try:
        machine = local_gpu.detect()
    except devmod.NoDeviceError:
        machine = None
    try:
        # re-timing runs SGLang's kernels: on a CUDA GPU only, unless told not to
        on_gpu = machine is not None and machine.kind == "gpu" and not no_retime
        code, lines = check_folder(folder, sglang_version, machine, batch_sizes=batch_sizes,
                                   retime=retime if on_gpu else None)
    except CheckError as e:
        raise UsageError(str(e)) from None
    lines.append("fresh: the folder matches this machine" if code == 0 else "drifted: re-tune or re-export (see above)")
    return code, lines


def merge_choices(sources, out="tuned_configs") -> list[str]:
    lines: list[str] = []
    from autotune.export import server_args

    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file; name the folder that holds <device>/server_args.yaml")
    from autotune.folder.tuned import nested_problem
    if nested_problem(out):
        raise UsageError(nested_problem(out))
    import contextlib

    from autotune.gpus.device import DeviceInfo
    from autotune.errors import Incomplete
    try:
        server_args.check_merge(sources, out)      # every source, before anything is written
        with contextlib.ExitStack() as stack:      # each device's folder changes as one
            folders = {}
            for src in sources:
                device = DeviceInfo.from_dict(server_args.read_source(src)["device"])
                if device.file_name not in folders:
                    folders[device.file_name] = stack.enter_context(TunedFolder.under(out, device).held())
                    folders[device.file_name].begin()
                tuned = folders[device.file_name]
                path = tuned.real(server_args.merge_folder(src, tuned))
    except server_args.ChoicesError as e:
        raise UsageError(str(e)) from None
    unchanged = [f.outcome for f in folders.values() if f.outcome]
    if unchanged:
        raise Incomplete("; ".join(unchanged))
    if not any(f.swapped for f in folders.values()):
        return [f"nothing changed: {path} already holds the backend choices of {', '.join(sources)} (no file "
                "rewritten)"]
    lines.append(f"merged the backend choices of {', '.join(sources)} -> {path}")
    return lines
