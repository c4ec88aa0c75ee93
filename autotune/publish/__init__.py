"""Publish tuned configs into the git repository servers deploy from.

`autotune publish --to PATH_OR_URL --branch tuned/<device>` copies tuned_configs/<device>/ into the
serving repo (under --path, default the repo root's tuned_configs/<device>), on a new branch, as one
commit whose message states device, versions, per-kernel gains and the validation result. It
refuses when validation is missing or failed, when the serving repo's working tree is dirty, and
when the serving repo already holds faster configs (same device and versions) at every M; where it
holds faster ones at some M, those are kept per M and named. Plain git CLI, no hidden state.

Everything the commit holds is read, merged and checked in memory first (`_files`): a file the
provenance lists must be in the tuned folder, and every target must resolve inside the serving
repo's folder; only then is the branch made (serving_repo.new_branch puts the repo back as it was
should anything fail after that). The serving repo is held by one publish at a time (serving_repo.held),
and git runs through autotune.programs (no inherited GIT_* variable; a URL's credentials never printed).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from autotune.families.triton_moe.schema import schema_problem
from autotune.folder.config_files import config_folder
from autotune.export import server_args
from autotune.folder.tuned import TunedFolder, tuned_names
from autotune.fileio.writing import Files, NotOurs, claim_files, inside, json_bytes, read_json, write_all
from autotune.fileio.reading import read_bytes
from autotune import programs
from autotune.programs import scratch
from autotune.publish.serving_repo import (
    PublishError,
    git,
    git_dir,
    held,
    is_url,
    new_branch,
    prove_committed,
    refuse_ignored,
)

VALIDATION = "validation.json"


@dataclass
class Outcome:
    branch: str
    commit: str
    files: list = field(default_factory=list)
    kept: dict = field(default_factory=dict)      # file -> {M: why the serving repo's entry stayed}
    message: str = ""


def validation_verdict(src: Path) -> str:
    """One line for the commit message; raises when validation is missing or failed."""
    data = read_json(src / VALIDATION)
    if data is None:
        raise PublishError(f"{src / VALIDATION} is missing: run `autotune validate --gate` first")
    if not isinstance(data, dict):
        raise PublishError(f"{src / VALIDATION} holds a {type(data).__name__}, not a validation record")
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
    """A folder's provenance through check's reader (the one that validates its shape)."""
    from autotune.errors import CheckError
    try:
        return TunedFolder(folder).recorded()
    except CheckError as e:
        raise PublishError(str(e)) from None


def device_folder(src: str | Path) -> str:
    """The folder name a tuned folder is published under (tuned_configs/<it>, branch tuned/<it>): its
    device's, as the export named it, whatever the folder was copied to or reached by (`.`, `x/..`)."""
    src = Path(src)
    name = ((_provenance(src).get("device") or {}).get("name") if TunedFolder(src).has_provenance() else None)
    return name.replace(" ", "_") if isinstance(name, str) and name.strip() else src.resolve().name


def _listed(src: Path, rel: str, entry: dict | None = None) -> dict:
    """A config file the tuned folder's provenance lists, in SGLang's schema (a missing one was
    published as `{}`: what the provenance says and what the folder holds must agree)."""
    path = src / rel
    if not path.is_file():
        said = f" (its entry names Triton {entry.get('triton')})" if entry else ""
        raise PublishError(f"{path} is listed in {TunedFolder(src).provenance_file}{said} but missing: re-export the "
                           "folder")
    doc = read_json(path)
    why = schema_problem(doc)
    if why:
        raise PublishError(f"{path}: {why}; not published")
    return doc


def _plan(src: Path, dest: Path) -> tuple[dict, dict, dict]:
    """In memory: {relative path: JSON content} to write, the merged provenance, and what the
    serving repo keeps per file. Nothing touches the serving repo until the plan is accepted."""
    ours_all = _provenance(src)
    theirs_all = _provenance(dest) if TunedFolder(dest).has_provenance() else {}
    writes, kept_all = {}, {}
    merged = {"device": ours_all.get("device"), "files": dict(theirs_all.get("files", {}))}
    changed = False
    for name, entry in ours_all.get("files", {}).items():
        folder = config_folder(entry.get("triton"))
        theirs_entry = theirs_all.get("files", {}).get(name)
        per_m, kept = entry.get("per_M", {}), {}
        # a tuned file and its _down file were chosen as one pair (one shared tile height, one pair time):
        # the same M decision for both
        for fname in (name, entry.get("down_file")):
            if not fname:
                continue
            rel = f"{folder}/{fname}"
            theirs = read_json(dest / rel)
            cfgs, per_m, kept = merge_file(_listed(src, rel, entry), entry, theirs, theirs_entry)
            changed |= cfgs != theirs
            writes[rel] = cfgs
        merged["files"][name] = {**entry, "per_M": per_m}
        if kept:
            kept_all[name] = kept
    # SGLang's shipped files that export laid beside ours (autotune.families.triton_moe.overlay): they travel too, so
    # the published folder keeps every shipped shape; never over a tuned file or a file not laid by an overlay.
    overlay = ours_all.get("shipped_overlay")
    if overlay:
        tuned = tuned_names(merged)
        theirs_overlay = set((theirs_all.get("shipped_overlay") or {}).get("files", []))
        for rel in overlay.get("files", []):
            if Path(rel).name not in tuned and (rel in theirs_overlay or not (dest / rel).exists()):
                writes[rel] = _listed(src, rel)
        merged["shipped_overlay"] = overlay
    if not changed:
        raise PublishError(f"the serving repo's configs in {dest} are as fast or faster at every batch size "
                           f"(same device and versions): nothing to publish")
    return writes, merged, kept_all


def _dest_ours(dest: TunedFolder):
    """What in the serving repo's folder is ours to replace beside its provenance (which the folder's handle
    claims): the config files that provenance lists (the tuned files and the shipped overlay)."""
    try:
        theirs = dest.provenance_as_written()
    except ValueError:
        theirs = None
    return dest.ours(theirs if dest.provenance_is_ours() else None)


def _files(src: Path, dest: Path, writes: dict, merged: dict) -> Files:
    """Every file the commit holds, its content and what makes the serving repo's copy ours to
    replace; each target resolved inside `dest` (the one place: a name read from a provenance that
    would land outside is refused here, whatever got it past the schema) and claimed."""
    from autotune.validate.report import report_targets

    folder = TunedFolder(dest)
    ours = _dest_ours(folder)
    files = {inside(dest, rel): (json_bytes(doc), ours) for rel, doc in writes.items()}
    files |= folder.provenance_files(merged)
    for target, is_ours in report_targets(dest):        # validate's files travel with the configs
        if (src / target.name).exists():
            try:
                files[target] = (read_bytes(src / target.name), is_ours)
            except OSError as e:
                raise PublishError(f"{src / target.name} cannot be read ({e.strerror or e})") from None
    if (src / server_args.DETAILS).exists():
        # The serving repo's other families stay; ours replace theirs (server_args.merge: one place).
        try:
            files |= server_args.merged_from(src, folder)
        except server_args.ChoicesError as e:
            raise PublishError(f"backend choices cannot be merged into {dest}: {e}") from None
    try:
        claim_files(files)
    except NotOurs as e:
        raise PublishError(f"{e} (in the serving repo)") from None
    return files


def _validated(src: Path) -> None:
    """The folder is, byte for byte, the one its validation judged, measured and validated on a GPU."""
    from autotune.validate.judged import publish_problem

    why = publish_problem(src, read_json(src / VALIDATION))
    if why:
        raise PublishError(f"{why}; not publishing")


def _message(src: Path, merged: dict, verdict: str, kept: dict) -> str:
    versions = (merged.get("device") or {}).get("versions", {})
    device = (merged.get("device") or {}).get("name", src.name)
    msg = [f"autotune: tuned configs for {device}", "",
           "versions: " + ", ".join(f"{k} {versions[k]}" for k in ("torch", "triton", "sglang", "cuda")
                                    if k in versions),
           f"validation: {verdict}", "gains:", *_gains(merged)]
    for name, k in kept.items():
        msg.append(f"kept from the serving repo in {name}: " + "; ".join(f"M={M}: {w}" for M, w in k.items()))
    return "\n".join(msg)


def publish(src: str | Path, to: str, branch: str, path: str | None = None) -> Outcome:
    src = Path(src)
    if not TunedFolder(src).has_provenance():
        raise PublishError(f"{src} holds no provenance.json: nothing tuned to publish")
    verdict = validation_verdict(src)
    if not is_url(to):
        repo = Path(to)
        if not (repo / ".git").exists():
            raise PublishError(f"{repo} is not a git working tree")
        with held(repo):
            return _publish_into(repo, src, branch, path, verdict)
    with scratch("autotune-publish-") as clone:      # removed whatever fails, the clone's own failure too
        r = programs.run(["git", "clone", "-q", to, str(clone)])
        if r.returncode:
            raise PublishError(f"cannot clone {to} ({r.program}): {r.said()}")
        outcome = _publish_into(clone, src, branch, path, verdict)
        git(clone, "push", "-q", "origin", branch)
        return outcome


def _destination(repo: Path, src: Path, path: str | None) -> Path:
    """The serving repo's folder the tuned files go to: a folder of its working tree."""
    path = path or f"tuned_configs/{device_folder(src)}"
    dest, store = repo / path, git_dir(repo)
    if ".git" in Path(path).parts or dest.resolve() == store or store in dest.resolve().parents:
        raise PublishError(f"--path {path} is inside the serving repo's .git folder (git's own store, never "
                           "committed): name a folder of its working tree")
    blocking = next((p for p in (dest, *dest.parents) if p.exists()), repo)
    if not blocking.is_dir():
        raise PublishError(f"--path {path}: {blocking} is a file in the serving repo; name a folder")
    if repo.resolve() not in dest.resolve().parents:
        raise PublishError(f"--path {path} is not a folder inside the serving repo {repo}")
    return dest


def _publish_into(repo: Path, src: Path, branch: str, path: str | None, verdict: str) -> Outcome:
    """The publish proper, into a repo held by this process: every refusal before the branch is made."""
    if git(repo, "status", "--porcelain"):
        raise PublishError(f"{repo} has uncommitted changes: commit or stash them first")
    if git(repo, "branch", "--list", branch):
        raise PublishError(f"branch {branch} already exists in {repo}")
    dest = _destination(repo, src, path)
    writes, merged, kept = _plan(src, dest)
    files = _files(src, dest, writes, merged)
    _validated(src)
    refuse_ignored(repo, files)             # every refusal up to here: the repo is untouched
    msg = _message(src, merged, verdict, kept)
    with new_branch(repo, branch, files):
        write_all(files)
        git(repo, "add", "-A", str(dest.relative_to(repo)))
        git(repo, "-c", "user.name=autotune", "-c", "user.email=autotune@localhost", "commit", "-q", "-m", msg)
        prove_committed(repo, files)        # a refusal here puts the repo back (new_branch)
    return Outcome(branch, git(repo, "rev-parse", "HEAD"), sorted(p.relative_to(repo).as_posix() for p in files),
                   kept, msg)
