"""`autotune check FOLDER`: do the committed configs still match the machine that serves them?

Reads the folder's provenance.json (written by export) and compares it with this machine:
- SGLang: the releases each file runs in (`sglang_versions`, autotune.adapters.sglang_versions) against
  the release installed here or named by --sglang-version: a file that would crash it is drift;
- GPU: SGLang matches `device_name` exactly, so files measured on another GPU model are never
  loaded here: drift;
- Triton: SGLang loads a file from another Triton folder with only a warning, and a Triton
  upgrade can move the best config (vLLM issue 32806): drift, re-tune;
- torch, CUDA, driver, FlashInfer: listed when they differ (they move timings less directly).
On a GPU that matches, a sample of each Triton MoE file's batch sizes is re-timed as SGLang runs
the layer (autotune.families.triton_moe.moe_layer): the folder's config against SGLang's shipped file and its
default heuristic, in turns; tuned slower than either beyond the measured spread is drift.
Without a GPU only the SGLang check runs, and the output says so. Exit 0: fresh; 1: drifted
(each file or fact listed with why and what to do); 2: bad input (no folder, no provenance, a
provenance without version records, an unsupported release).
"""
from __future__ import annotations

from pathlib import Path

from autotune.adapters.sglang_versions import VersionError, parse_targets
from autotune.errors import CheckError

FRESH, DRIFTED = 0, 1


def machine_drift(prov: dict, machine) -> tuple[list[str], list[str]]:
    """(drift: reasons to re-tune, notes: differences worth knowing) between provenance and `machine`."""
    dev = prov.get("device") or {}
    was, now = dev.get("versions", {}), machine.versions
    drift, notes = [], []
    if dev.get("name") != machine.name:
        drift.append(f"GPU: measured on {dev.get('name')!r}, this is {machine.name!r}: SGLang matches device_name "
                     "exactly and will not load these files here (tune this GPU, or export --device-name for "
                     "another SKU of the same chip)")
    if was.get("triton") != now.get("triton"):
        drift.append(f"Triton: measured with {was.get('triton')}, this machine has {now.get('triton')}: SGLang falls "
                     "back to the other Triton folder with a warning, and the best configs can move: re-tune")
    for k in ("torch", "cuda", "flashinfer"):
        if was.get(k) and now.get(k) and was.get(k) != now.get(k):
            notes.append(f"{k}: measured with {was[k]}, this machine has {now[k]}")
    if dev.get("driver") and machine.driver and dev.get("driver") != machine.driver:
        notes.append(f"driver: measured with {dev['driver']}, this machine has {machine.driver}")
    return drift, notes


def _targets(version_spec: str | None) -> list[str]:
    try:
        return parse_targets(version_spec)
    except VersionError as e:
        raise CheckError(str(e)) from None


def file_drift(prov: dict, targets: list[str], machine=None) -> dict[str, list[str]]:
    """Per file of the folder: why it must be re-tuned or re-exported (empty: fresh)."""
    machine_reasons = machine_drift(prov, machine)[0] if machine is not None else []
    out = {}
    for name, entry in sorted(prov["files"].items()):
        valid = entry.get("sglang_versions")
        if not isinstance(valid, list):
            raise CheckError(f"provenance.json: {name} records no SGLang versions (exported before version "
                             "provenance): re-export it with --sglang-version")
        missing = [v for v in targets if v not in valid]
        why = [f"does not run in SGLang {', '.join(missing)} (runs in {', '.join(valid) or 'none'})"] if missing else []
        out[name] = why + machine_reasons
    return out


def unlisted_configs(folder: str | Path, prov: dict) -> list[str]:
    """The config files SGLang would load from the folder (configs/triton_*/*.json) that its provenance
    does not list (tuned files, their SKU copies, the shipped overlay): dropped in by another hand, they
    are served unchecked, whether or not the provenance records the folder's hashes."""
    from autotune.folder.config_files import listed_files

    folder = Path(folder)
    listed = {p.relative_to(folder).as_posix() for p, _, _ in listed_files(folder, prov).values()
              if folder in p.parents}
    found = (p.relative_to(folder).as_posix() for p in folder.glob("configs/triton_*/*.json") if p.is_file())
    return sorted(rel for rel in found if rel not in listed)


def check_folder(folder: str | Path, version_spec: str | None, machine=None, *, retime=None, batch_sizes=None,
                 loader="sglang") -> tuple[int, list[str]]:
    """(drifted count, report lines). `retime(folder, prov, machine, batch_sizes=)` re-times the files on this
    GPU (the command passes the family's, autotune.families.triton_moe.retime); None: not re-timed."""
    from autotune.folder.config_files import file_problems, files_family
    from autotune.folder.tuned import TunedFolder

    files = files_family()

    tuned = TunedFolder(folder)
    prov = tuned.recorded()
    targets = _targets(version_spec)
    lines, bad = [], 0
    if not prov["files"]:       # a backend-choices-only export is one; say it rather than a bare "fresh"
        lines.append("provenance.json lists no tuned config files: no file here for SGLang's loaders to check")
    # the files themselves: there, unchanged since export, in SGLang's schema, loaded by SGLang's loader
    broken = file_problems(folder, prov, files.loads if loader == "sglang" else loader)
    for name, why in broken.items():
        bad += 1
        lines.append(f"drift: {name}: {why}")
    said = tuned.unvouched(prov)               # every file, listed or not (where provenance has hashes)
    said += [(rel, "not listed in provenance.json: SGLang would load it unchecked (remove it, or re-export the "
                   "folder)") for rel in unlisted_configs(folder, prov) if rel not in dict(said)]
    for rel, why in said:
        if Path(rel).name in broken:
            continue
        if rel.startswith("configs/"):                  # what SGLang's loader serves
            bad += 1
            lines.append(f"drift: {rel}: {why}")
        else:                                           # publish merges server_args.yaml, say
            lines.append(f"note: {rel}: {why}")
    for name, why in file_drift(prov, targets).items():
        if name in broken:
            continue
        if why:
            bad += 1
            lines.append(f"{name}: {why[0]}; re-export with --sglang-version "
                         f"{next(v for v in targets if v not in prov['files'][name]['sglang_versions'])}")
        else:
            lines.append(f"{name}: runs in SGLang {', '.join(targets)}")
    if machine is None:
        lines.append("no GPU visible here: GPU, Triton, torch and driver not compared (run check on the serving machine)")
    else:
        drift, notes = machine_drift(prov, machine)
        bad += len(drift)
        lines += [f"drift: {d}" for d in drift] + [f"note: {n}" for n in notes]
        if not drift:
            lines.append(f"GPU {machine.name} and Triton {machine.versions.get('triton')} as measured")
            if retime is not None:
                slow, timed = retime(folder, prov, machine, batch_sizes=batch_sizes)
                bad += slow
                lines += timed
    return (DRIFTED if bad else FRESH), lines
