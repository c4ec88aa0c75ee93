"""Publish tuned configs into the git repository servers deploy from.

`autotune publish --to PATH_OR_URL --branch tuned/<device>` copies tuned_configs/<device>/ into the
serving repo (under --path, default the repo root's tuned_configs/<device>), on a new branch, as one
commit whose message states device, versions, per-kernel gains and the validation result. It
refuses when validation is missing or failed, when the serving repo's working tree is dirty, and
when the serving repo already holds faster configs (same device and versions) at every M; where it
holds faster ones at some M, those are kept per M and named. Plain git CLI, no hidden state.
"""
from __future__ import annotations

import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .device import DeviceInfo
from .export import server_args
from .export.provenance import PROVENANCE, tuned_names
from .fsutil import NotOurs, claim, copy_file, read_json, write_json

VALIDATION = "validation.json"


class PublishError(ValueError):
    pass


@dataclass
class Outcome:
    branch: str
    commit: str
    files: list = field(default_factory=list)
    kept: dict = field(default_factory=dict)      # file -> {M: why the serving repo's entry stayed}
    message: str = ""


def _git(repo: Path, *args: str) -> str:
    r = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise PublishError(f"git {' '.join(args)} failed in {repo}: {r.stderr.strip() or r.stdout.strip()}")
    return r.stdout.strip()


def _is_url(target: str) -> bool:
    return "://" in target or target.startswith("git@") or target.endswith(".git")


def validation_verdict(src: Path) -> str:
    """One line for the commit message; raises when validation is missing or failed."""
    data = read_json(src / VALIDATION)
    if data is None:
        raise PublishError(f"{src / VALIDATION} is missing: run `autotune validate --gate` first")
    gate = data.get("gate") or {}
    lines = gate.get("lines") or []
    if gate.get("passed") is not True:
        why = "; ".join(lines) if lines else "the gate did not run or did not pass"
        raise PublishError(f"validation failed ({why}); not publishing")
    verdict = lines[-1] if lines else "validation passed"
    if gate.get("regressions"):
        verdict += " (regressions allowed: " + ", ".join(map(str, gate["regressions"])) + ")"
    return verdict


def _same_stack(a: dict, b: dict) -> bool:
    keys = ("triton", "sglang", "torch")
    return a.get("device") == b.get("device") and all(
        (a.get("versions") or {}).get(k) == (b.get("versions") or {}).get(k) for k in keys)


def merge_file(ours: dict, ours_prov: dict, theirs: dict | None, theirs_prov: dict | None) -> tuple[dict, dict, dict]:
    """Per M, the serving repo's entry stays where it was measured faster on the same stack.
    Returns (merged configs, merged per-M provenance, kept {M: why})."""
    merged, per_m, kept = dict(ours), dict(ours_prov.get("per_M", {})), {}
    if not theirs or not theirs_prov or not _same_stack(ours_prov, theirs_prov):
        return merged, per_m, kept
    for M, cfg in theirs.items():
        mine = ours_prov.get("per_M", {}).get(M, {}).get("tuned_us")
        old = theirs_prov.get("per_M", {}).get(M, {}).get("tuned_us")
        if old is not None and (M not in ours or mine is None or old < mine):
            merged[M], per_m[M] = cfg, theirs_prov["per_M"][M]
            if M in ours:
                kept[M] = f"serving repo's {old:.2f} us beats ours {mine:.2f} us"
    return dict(sorted(merged.items(), key=lambda kv: int(kv[0]))), per_m, kept


def _gains(prov: dict) -> list[str]:
    lines = []
    for name, entry in sorted(prov.get("files", {}).items()):
        ratios = []
        for rec in entry.get("per_M", {}).values():
            ref = min((x for x in (rec.get("default_us"), rec.get("shipped_us")) if x), default=None)
            if ref and rec.get("tuned_us"):
                ratios.append(ref / rec["tuned_us"])
        if ratios:
            lines.append(f"  {name}: {min(ratios):.3f}x-{max(ratios):.3f}x over SGLang's default/shipped "
                         f"({len(ratios)} batch sizes)")
    return lines


def _provenance(folder: Path) -> dict:
    """A folder's provenance.json through check's reader (the one that validates its shape)."""
    from .check import CheckError, read_provenance
    try:
        return read_provenance(folder)
    except CheckError as e:
        raise PublishError(str(e)) from None


def _plan(src: Path, dest: Path) -> tuple[dict, dict, dict]:
    """In memory: {relative path: JSON content} to write, the merged provenance, and what the
    serving repo keeps per file. Nothing touches the serving repo until the plan is accepted."""
    ours_all = _provenance(src)
    theirs_all = _provenance(dest) if (dest / PROVENANCE).exists() else {}
    writes, kept_all = {}, {}
    merged = {"device": ours_all.get("device"), "files": dict(theirs_all.get("files", {}))}
    changed = False
    for name, entry in ours_all.get("files", {}).items():
        folder = f"configs/triton_{str(entry.get('triton', 'unknown')).replace('.', '_')}"
        theirs_entry = theirs_all.get("files", {}).get(name)
        per_m, kept = entry.get("per_M", {}), {}
        # gate_up and _down share BLOCK_SIZE_M and one pair time: the same M decision for both
        for fname in (name, entry.get("down_file")):
            if not fname:
                continue
            theirs = read_json(dest / folder / fname)
            cfgs, per_m, kept = merge_file(read_json(src / folder / fname, default={}) or {}, entry, theirs,
                                           theirs_entry)
            changed |= cfgs != theirs
            writes[f"{folder}/{fname}"] = cfgs
        merged["files"][name] = {**entry, "per_M": per_m}
        if kept:
            kept_all[name] = kept
    # SGLang's shipped files that export laid beside ours (autotune.export.overlay): they travel too, so
    # the published folder keeps every shipped shape; never over a tuned file or a file not laid by an overlay.
    overlay = ours_all.get("shipped_overlay")
    if overlay:
        tuned = tuned_names(merged)
        theirs_overlay = set((theirs_all.get("shipped_overlay") or {}).get("files", []))
        for rel in overlay.get("files", []):
            if Path(rel).name not in tuned and (rel in theirs_overlay or not (dest / rel).exists()):
                writes[rel] = read_json(src / rel)
        merged["shipped_overlay"] = overlay
    if not changed:
        raise PublishError(f"the serving repo's configs in {dest} are as fast or faster at every batch size "
                           f"(same device and versions): nothing to publish")
    writes[PROVENANCE] = merged
    return writes, merged, kept_all


def _dest_ours(dest: Path) -> dict:
    """What in the serving repo's folder is ours to replace: its provenance.json (our format) and
    the config files that provenance lists (the tuned files and the shipped overlay)."""
    from .export.provenance import PROVENANCE_OURS, ours_in

    try:
        theirs = read_json(dest / PROVENANCE, default=None)
    except ValueError:
        theirs = None
    return {PROVENANCE: PROVENANCE_OURS, "*": ours_in(theirs if PROVENANCE_OURS(dest / PROVENANCE) else None)}


def _extras(src: Path, dest: Path) -> list:
    """validate's files that travel with the configs, each with what makes the repo's copy ours."""
    from .validate.report import report_targets
    return [(p.name, ours) for p, ours in report_targets(dest) if (src / p.name).exists()]


def publish(src: str | Path, to: str, branch: str, path: str | None = None) -> Outcome:
    src = Path(src)
    if not (src / PROVENANCE).exists():
        raise PublishError(f"{src} holds no {PROVENANCE}: nothing tuned to publish")
    verdict = validation_verdict(src)
    clone = None
    if _is_url(to):
        clone = Path(tempfile.mkdtemp(prefix="autotune-publish-"))
        r = subprocess.run(["git", "clone", "-q", to, str(clone)], capture_output=True, text=True)
        if r.returncode:
            raise PublishError(f"cannot clone {to}: {r.stderr.strip()}")
        repo = clone
    else:
        repo = Path(to)
        if not (repo / ".git").exists():
            raise PublishError(f"{repo} is not a git working tree")
    try:
        if _git(repo, "status", "--porcelain"):
            raise PublishError(f"{repo} has uncommitted changes: commit or stash them first")
        if _git(repo, "branch", "--list", branch):
            raise PublishError(f"branch {branch} already exists in {repo}")
        dest = repo / (path or f"tuned_configs/{src.name}")
        blocking = next((p for p in (dest, *dest.parents) if p.exists()), repo)
        if not blocking.is_dir():
            raise PublishError(f"--path {path}: {blocking} is a file in the serving repo; name a folder")
        if repo.resolve() not in dest.resolve().parents:
            raise PublishError(f"--path {path} is not a folder inside the serving repo {repo}")
        writes, merged, kept = _plan(src, dest)
        dest_ours = _dest_ours(dest)
        try:                    # every file the commit would replace, before the repo is touched
            for rel in writes:
                claim(dest / rel, dest_ours.get(rel, dest_ours["*"]))
            for extra, is_ours in _extras(src, dest):
                claim(dest / extra, is_ours)
        except NotOurs as e:
            raise PublishError(f"{e} (in the serving repo)") from None
        if (src / "backend_choice.json").exists():      # refused here, before the repo is touched
            try:
                ours = read_json(src / "backend_choice.json")
                server_args.check_folder(dest, DeviceInfo.from_dict(ours["device"]), exact=True)
            except (server_args.ChoicesError, KeyError, TypeError, ValueError) as e:
                raise PublishError(f"backend choices cannot be merged into {dest}: {e}") from None
        _git(repo, "checkout", "-q", "-b", branch)
        for rel, content in writes.items():
            write_json(dest / rel, content, ours=dest_ours.get(rel, dest_ours["*"]))
        if (src / "backend_choice.json").exists():
            # The serving repo's other families stay; ours replace theirs (server_args.merge: one place).
            try:
                server_args.merge_folder(src, dest, exact=True)
            except server_args.ChoicesError as e:
                raise PublishError(f"backend choices not merged into {dest}: {e}") from None
        for extra, is_ours in _extras(src, dest):
            copy_file(src / extra, dest / extra, ours=is_ours)
        versions = (merged.get("device") or {}).get("versions", {})
        device = (merged.get("device") or {}).get("name", src.name)
        msg = [f"autotune: tuned configs for {device}", "",
               "versions: " + ", ".join(f"{k} {versions[k]}" for k in ("torch", "triton", "sglang", "cuda")
                                        if k in versions),
               f"validation: {verdict}", "gains:", *_gains(merged)]
        for name, k in kept.items():
            msg.append(f"kept from the serving repo in {name}: " + "; ".join(f"M={M}: {w}" for M, w in k.items()))
        _git(repo, "add", "-A", str(dest.relative_to(repo)))
        _git(repo, "-c", "user.name=autotune", "-c", "user.email=autotune@localhost", "commit", "-q", "-m",
             "\n".join(msg))
        outcome = Outcome(branch, _git(repo, "rev-parse", "HEAD"),
                          [str((dest / rel).relative_to(repo)) for rel in writes], kept, "\n".join(msg))
        if clone is not None:
            _git(repo, "push", "-q", "origin", branch)
        return outcome
    finally:
        if clone is not None:
            shutil.rmtree(clone, ignore_errors=True)
