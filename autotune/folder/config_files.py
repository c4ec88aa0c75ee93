"""What `autotune check` reads of a tuned folder's config files: each file listed in provenance.json
(the tuned files, their SKU copies, the shipped overlay) must be there, unchanged since export
(the sha256 provenance records), in the schema of SGLang's Triton config files, and loaded by
SGLang's own loader (sglang_loader.sglang_selection) as the config the file holds.

The schema: keys are batch sizes (positive integers, as text); each value has BLOCK_SIZE_M/N/K
(positive powers of two), GROUP_SIZE_M, num_warps (a power of two) and num_stages (positive
integers), and optionally USE_TMA (true/false); nothing else (SGLang passes every key to its kernel).

The names a provenance gives are joined to its folder to read, write, copy and remove files, so they
are checked where it is parsed: a tuned file's name (and its `_down` file's, and its Triton version,
a folder name) is a plain file name; an overlay file is a path of plain names inside the folder.
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, Optional

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator

from autotune.fileio.writing import sha256
from autotune.fileio.names import DeviceName, PlainText, TritonVersion, Version, plain_text_problem
from autotune.measure.recording_header import KINDS
from autotune.fileio.reading import first_error, load_json


class TritonConfig(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    BLOCK_SIZE_M: int = Field(gt=0)
    BLOCK_SIZE_N: int = Field(gt=0)
    BLOCK_SIZE_K: int = Field(gt=0)
    GROUP_SIZE_M: int = Field(gt=0)
    num_warps: Optional[int] = Field(default=None, gt=0)     # Triton's defaults where absent: only
    num_stages: Optional[int] = Field(default=None, gt=0)    # SGLang's own shipped files leave them out
    USE_TMA: Optional[bool] = None

    @field_validator("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "num_warps")
    @classmethod
    def _power_of_two(cls, v):
        if v is not None and v & (v - 1):
            raise ValueError(f"{v} is not a power of two")
        return v


def _printable(v: str) -> None:
    """A name SGLang writes is printable ASCII: a control character (a newline, a tab) split the lines
    autotune prints, and anything else is not one of its files."""
    if not (v.isascii() and v.isprintable()):
        raise ValueError(f"{v!r:.80} is not a plain file name (printable ASCII, no control character)")


def _plain_name(v: str) -> str:
    _printable(v)
    if v in ("", ".", "..") or any(c in v for c in "/\\"):
        raise ValueError(f"{v!r} is not a plain file name (no folder, no '..', not empty)")
    return v


def _inside_path(v: str) -> str:
    _printable(v)
    if any(part in ("", ".", "..") or "\\" in part for part in v.split("/")):
        raise ValueError(f"{v!r} is not a path inside the folder (plain names joined by '/', no '..', not absolute)")
    return v


FileName = Annotated[str, AfterValidator(_plain_name)]
InsidePath = Annotated[str, AfterValidator(_inside_path)]
Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


def _version_value(v):
    """A recorded version: text ('' or '?' where a package has none), a flag (triton_tma) or a
    package's own record (flashinfer_metadata)."""
    why = None if v is None or isinstance(v, (bool, dict)) else plain_text_problem(v, 80)
    if why:
        raise ValueError(why)
    return v


# The versions a provenance records: python, torch, triton, sglang, ... by name.
Versions = dict[Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,39}$")], Annotated[object, AfterValidator(_version_value)]]


class _Record(BaseModel):
    """A provenance record: the fields autotune reads are typed, the rest is kept as written."""
    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)


class PerM(_Record):
    tuned_us: Optional[float] = None
    gate_up_us: Optional[float] = None
    down_us: Optional[float] = None
    default_us: Optional[float] = None
    shipped_us: Optional[float] = None
    source: Optional[PlainText] = None


class FileEntry(_Record):
    down_file: Optional[FileName] = None
    problem: Optional[dict] = None
    device: Optional[DeviceName] = None
    compute_capability: Optional[int] = None
    driver: Optional[PlainText] = None
    triton: Optional[TritonVersion] = None     # names its configs/triton_<version>/ folder
    measured_on: Optional[Literal[KINDS]] = None
    measured_on_sku: Optional[DeviceName] = None
    sglang_versions: Optional[list[Version]] = None
    sglang_targets: Optional[list[Version]] = None
    per_M: dict[str, PerM] = {}
    sha256: dict[FileName, Sha256] = {}
    versions: Versions = {}


class Overlay(_Record):
    sglang: Optional[Version] = None
    targets: list[Version] = []
    files: list[InsidePath] = []
    skipped: dict[InsidePath, PlainText] = {}
    sha256: dict[InsidePath, Sha256] = {}


class RecordedDevice(_Record):
    name: Optional[DeviceName] = None           # names the folder and branch publish writes
    sm: Optional[int] = None
    driver: Optional[PlainText] = None
    versions: Versions = {}


class Provenance(_Record):
    device: RecordedDevice = RecordedDevice()
    files: dict[FileName, FileEntry]
    shipped_overlay: Optional[Overlay] = None


class ChoiceDevice(_Record):
    name: DeviceName
    sm: int
    kind: str = "gpu"
    versions: dict = {}


class FamilyChoice(_Record):
    server_choice: dict[str, dict]
    chosen_mix: Optional[str] = None
    measured: dict = {}


class BackendChoices(_Record):
    """backend_choice.json (autotune.export.server_args)."""
    device: ChoiceDevice
    families: dict[str, FamilyChoice]
    checkpoint: Optional[str] = None




def choices_problem(doc) -> str | None:
    """Why `doc` is not a backend_choice.json autotune reads; None when it is."""
    return first_error(BackendChoices, doc)


def provenance_problem(doc) -> str | None:
    """Why `doc` is not a provenance.json autotune reads; None when it is."""
    return first_error(Provenance, doc)


def schema_problem(doc, sglangs_own=lambda M, config: True) -> str | None:
    """Why `doc` (a parsed config file) is not one SGLang's loader and kernel take; None when it is.
    An entry without num_warps or num_stages must be one of SGLang's own configs at that M (its
    default heuristic and its shipped files leave them to Triton): `sglangs_own(M, config)`."""
    if not isinstance(doc, dict) or not doc:
        return "not a JSON object of batch size -> config"
    for key, config in doc.items():
        if not (key.isdigit() and int(key) > 0 and str(int(key)) == key):
            return f"key {key!r} is not a batch size (SGLang's loader reads every key as an integer)"
        try:
            c = TritonConfig.model_validate(config)
            if (c.num_warps is None or c.num_stages is None) and not sglangs_own(int(key), config):
                return f"M={key}: no {'num_warps' if c.num_warps is None else 'num_stages'} (every tuned config names both)"
        except ValidationError as e:
            err = e.errors()[0]
            where = ".".join(map(str, err["loc"])) or "its config"
            return f"M={key}: {where}: {err['msg'].removeprefix('Value error, ')} (got {err.get('input')!r:.60})"
    return None


def config_folder(triton) -> str:
    """The folder, relative to a device folder, SGLang looks in for configs made with `triton`."""
    return f"configs/triton_{'unknown' if triton is None else str(triton).replace('.', '_')}"


def listed_files(folder: Path, prov: dict) -> dict[str, tuple[Path, str | None, dict | None]]:
    """name -> (path, recorded sha256 or None, the tuned file's provenance entry; None: the overlay's)."""
    out = {}
    for up, entry in sorted(prov.get("files", {}).items()):
        if not isinstance(entry, dict):
            continue
        triton_dir = folder / config_folder(entry.get("triton"))
        hashes = entry.get("sha256") if isinstance(entry.get("sha256"), dict) else {}
        for name in (up, entry.get("down_file")):
            if isinstance(name, str):
                out[name] = (triton_dir / name, hashes.get(name), entry)
    overlay = prov.get("shipped_overlay") if isinstance(prov.get("shipped_overlay"), dict) else {}
    hashes = overlay.get("sha256") if isinstance(overlay.get("sha256"), dict) else {}
    for rel in overlay.get("files") or []:
        if isinstance(rel, str):
            out.setdefault(rel, (folder / rel, hashes.get(rel), None))
    return out


def file_problems(folder: str | Path, prov: dict, loader=None) -> dict[str, str]:
    """name -> what is wrong with that listed file (absent: nothing). `loader(problem, path, doc)`
    asks SGLang's loader; None skips it."""
    folder = Path(folder)
    out = {}
    for name, (path, recorded, entry) in listed_files(folder, prov).items():
        if not path.is_file():
            out[name] = "listed in provenance.json but missing: re-export it"
            continue
        if recorded and sha256(path) != recorded:
            out[name] = "changed since export (its sha256 is not the one provenance.json recorded): re-export it"
            continue
        try:
            doc = load_json(path)
        except (OSError, ValueError) as e:
            out[name] = f"not valid JSON ({e}): SGLang's loader fails on it"
            continue
        own = (lambda M, c: True) if entry is None else (lambda M, c: _sglangs_own(entry, M, c, name))
        why = schema_problem(doc, own)
        if why is None and loader is not None and entry is not None and name != entry.get("down_file"):
            why = loader(entry, path, doc)
        if why:
            out[name] = why
    return out


def _problem_and_device(entry: dict):
    from autotune.gpus.device import DeviceInfo
    from autotune.problems.models import ModelError, Problem, problem_from_dict

    try:
        problem = problem_from_dict(entry.get("problem"))
    except ModelError:
        return None, None
    from autotune.gpus.catalog import SMEM_OPTIN
    sm = entry.get("compute_capability") if type(entry.get("compute_capability")) is int else 90
    device = DeviceInfo.from_dict({"name": str(entry.get("device")), "sm": sm, "smem_optin": SMEM_OPTIN.get(sm, 0),
                                   "versions": {"triton": str(entry.get("triton"))}})
    return (problem, device) if isinstance(problem, Problem) else (None, None)


def _sglangs_own(entry: dict, M: int, config: dict, name: str) -> bool:
    """Is `config` what SGLang itself runs at M for the file's problem (its shipped file, else its
    default heuristic)? Those may leave num_warps and num_stages to Triton; a tuned config may not."""
    from autotune.adapters.sglang_loader import sglang_default_config, sglang_selection

    problem, device = _problem_and_device(entry)
    if problem is None:
        return False
    plain = {k: v for k, v in config.items() if not (k == "USE_TMA" and not v)}
    up, down, _ = sglang_selection(problem, M, device)
    own = (down if name == entry.get("down_file") else up, sglang_default_config(problem, M, device))
    return any({k: v for k, v in c.items() if not (k == "USE_TMA" and not v)} == plain for c in own)


def sglang_loads(entry: dict, path: Path, doc: dict) -> str | None:
    """SGLang's own loader on the folder, for the file's problem at its first batch size: it must
    find the file and pick the config the file holds there."""
    from autotune.adapters.sglang_loader import sglang_selection

    problem, device = _problem_and_device(entry)
    if problem is None:
        return None if isinstance(entry.get("problem"), dict) and entry["problem"].get("kind") == "gemm" else \
            "its provenance entry has no readable problem"
    M = min(int(k) for k in doc)
    try:
        up, _, found = sglang_selection(problem, M, device, str(path.parent.parent.parent))
    except Exception as e:        # whatever SGLang's loader raises is what a server would hit
        return f"SGLang's loader fails on it ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
    if not found:
        return "SGLang's loader does not find it for its problem (file name, device or Triton folder)"
    want = {k: v for k, v in doc[str(M)].items() if not (k == "USE_TMA" and not v)}
    if {k: v for k, v in up.items() if not (k == "USE_TMA" and not v)} != want:
        return f"SGLang's loader picks {up} at M={M}, not the file's {want}"
    return None
