"""server_args.yaml: the backend choices as SGLang's `--config` file, every line explained.

One key per server flag. Several MoE families map to the same flag (--moe-runner-backend): the
file carries the one matching the checkpoint's expert precision (`checkpoint`), the others stay
as comments so one file serves whoever reads it. The full numbers go to backend_choice.json.

A folder collects the families of every run made into it: a later `--kernels fp8_gemm` run
replaces the fp8_gemm section and keeps the MoE choice an earlier run wrote (each section says
when and on what it was measured). Our part of the YAML is always rendered from backend_choice.json.

Every line a person wrote in server_args.yaml (a hand-written file, or lines added around ours) is
kept as it is: ours is one block between BEGIN and END, and a flag the user's lines set stays the
user's (ours is written as a comment under it). Choices measured on a GPU and replayed ones are
never mixed in one folder.
"""
from __future__ import annotations

from pathlib import Path

from autotune.contract import registry as registry
from autotune.search.sieve import MIXES, ServerChoice
from autotune.gpus.device import DeviceInfo, utc_now
from autotune.folder.tuned import TunedFolder
from autotune.fileio.writing import Files, json_bytes, json_with, write_all
from autotune.export.tactics import BLOCKLIST_FILE, CACHE_FILE
from autotune.fileio.reading import load_json, parse_yaml, read_text

SERVER_ARGS = "server_args.yaml"
DETAILS = "backend_choice.json"
DETAILS_OURS = json_with("device", "families")
BEGIN = "# autotune: SGLang server arguments"
END = "# autotune: end of the generated section (lines outside it are kept as they are)"
MIX_TEXT = {"decode": "decode mix (M <= 64)", "prefill": "prefill mix (M >= 512)"}
MOE_FLAG = "moe-runner-backend"


def flag_of(family: str) -> str:
    """The SGLang flag a family's choice goes to (a family this release does not know: its name)."""
    spec = registry.families().get(family)
    return spec.flag if spec is not None and spec.flag else family


class ChoicesError(ValueError):
    """A backend_choice.json that cannot be merged (unreadable, another device)."""


def choice_record(c: ServerChoice, family) -> dict:
    """What backend_choice.json keeps of one mix's choice: enough to render its section again."""
    names = set(c.totals) | {b for b in (c.backend, c.auto) if b}
    return {"backend": c.backend, "totals": c.totals, "auto": c.auto, "gain_vs_auto": c.gain_vs_auto,
            "per_m_gain": c.per_m_gain, "per_m_total": c.per_m_total, "disqualified": c.disqualified,
            "skipped": c.skipped, "sglang_values": {b: family.sglang_value(b) for b in sorted(names)},
            "auto_line": c.auto_line, "expected": c.expected, "surprises": c.surprises(),
            **({"within_noise": c.within_noise} if c.within_noise else {})}   # only when it decided


def _sglang_value(rec: dict, family: str, backend: str) -> str | None:
    values = rec.get("sglang_values")
    if values is not None:
        return values.get(backend)
    from autotune.contract import capabilities as table     # files from before sglang_values were stored

    try:
        return table.get(family, backend).sglang_value
    except KeyError:
        return None


def _section(family: str, entry: dict) -> tuple[list[str], str | None]:
    """Comment lines of one family's chosen mix, and the flag's value (None: SGLang's default stays)."""
    mix = entry.get("chosen_mix") or next(iter(entry["server_choice"]))
    rec = entry["server_choice"][mix]
    backend, totals, auto = rec["backend"], rec["totals"], rec["auto"]
    measured = entry.get("measured", {})
    out = [f"# {family}: {MIX_TEXT.get(mix, mix)}, time summed over the model's problems",
           f"#   measured on {measured.get('on', '?')}, {measured.get('date', '?')}"]
    for b, total in sorted(totals.items(), key=lambda kv: kv[1]):
        tags = [t for t, yes in (("chosen", b == backend), ("SGLang auto", b == auto),
                                 ("not selectable in SGLang", not _sglang_value(rec, family, b))) if yes]
        ratio = f" ({total / totals[backend]:.3f}x the chosen)" if backend and b != backend else ""
        out.append(f"#   {b}: {total:.1f} us{ratio}" + (f"  [{', '.join(tags)}]" if tags else ""))
    if rec.get("auto_line"):
        out.append(f"#   {rec['auto_line']}")
    elif rec.get("gain_vs_auto") is not None:          # files from before the auto line was stored
        out.append(f"#   gain over SGLang's auto ({auto}): {rec['gain_vs_auto']:.3f}x")
    elif auto:
        why = rec["disqualified"].get(auto) or rec["skipped"].get(auto) or "not measured on every problem"
        out.append(f"#   SGLang's auto ({auto}) is not usable here: {why}")
    if rec.get("per_m_gain") is not None:
        out.append(f"#   choosing per M instead of one backend would gain {rec['per_m_gain']:.3f}x"
                   " (counting backends SGLang cannot select)")
    expected = rec.get("expected", {})
    out += [f"#   disqualified {b}: {why}" + (f" (expected: {expected[b]})" if b in expected else "")
            for b, why in sorted(rec["disqualified"].items())]
    out += [f"#   skipped {b}: {why}" for b, why in sorted(rec["skipped"].items())]
    out += [f"#   note: {line}" for line in rec.get("surprises", [])]
    return out, (_sglang_value(rec, family, backend) if backend else None)


def render(details: dict, path: str | Path, user_flags=frozenset(), shown: str | Path | None = None) -> str:
    """server_args.yaml (to be written at `path`) from a backend_choice.json's content; `shown`: where the file
    will be once its folder's change is in (the tuned folder's words for `path`), as its lines name it."""
    device = DeviceInfo.from_dict(details["device"])
    families = details["families"]
    checkpoint = details.get("checkpoint")
    shown = Path(shown or path)
    lines = [f"{BEGIN} for {device.name} (SM{device.sm}), {details['date']}",
             f"# families: {', '.join(families)}; MoE runner line for: {checkpoint or '-'}",
             f"# load with: python -m sglang.launch_server --config {shown} ..."]
    folder = Path(path).parent
    if (folder / BLOCKLIST_FILE).exists():
        lines.append(f"# tactics our check disqualified: export FLASHINFER_TACTICS_BLOCKLIST="
                     f"{shown.parent / BLOCKLIST_FILE} before the launch (SGLang's start-up tuning then never picks them)")
    if (folder / CACHE_FILE).exists():
        lines.append(f"# winning tactics ({shown.parent / CACHE_FILE}) into SGLang's cache, one identical file per rank: "
                     f"autotune install {shown.parent} --model-path <the server's> --tp <N>")
    lines.append("")
    for name, entry in families.items():
        flag = flag_of(name)
        comments, value = _section(name, entry)
        lines += comments
        if value is None:
            lines.append(f"# {flag}: no backend SGLang can select ran correctly everywhere; SGLang's default stays")
        elif flag in user_flags:
            lines.append(f"# {flag}: {value}    # autotune's choice; this file's own {flag} line is kept")
        elif flag == MOE_FLAG and name != checkpoint:
            lines.append(f"# {flag}: {value}    # for {name.split('_', 1)[1]} experts (this file is for {checkpoint})")
        else:
            lines.append(f"{flag}: {value}")
        lines.append("")
    return "\n".join(lines + [END]) + "\n"


def user_lines(text: str) -> tuple[list[str], list[str]]:
    """(lines before our block, lines after it) of an existing server_args.yaml: everything but
    our block is the user's. A file of ours from before the END marker is all ours."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(BEGIN)), None)
    if start is None:
        return lines, []
    end = next((i for i in range(start, len(lines)) if lines[i] == END), None)
    return lines[:start], ([] if end is None else lines[end + 1:])


def _user_flags(path: Path) -> tuple[list[str], list[str], set]:
    import yaml

    try:
        text = read_text(path) if path.exists() else ""
    except (OSError, UnicodeDecodeError) as e:
        raise ChoicesError(f"{path} cannot be read ({e}); not merged") from None
    before, after = user_lines(text)
    try:
        doc = parse_yaml("\n".join(before + after)) or {}
    except yaml.YAMLError as e:
        raise ChoicesError(f"{path}: its own lines are not valid YAML ({str(e).splitlines()[0]}); "
                           "not merged (fix them, or move the file away)") from None
    if not isinstance(doc, dict):
        raise ChoicesError(f"{path}: its own lines are not a YAML mapping of server flags; not merged")
    return before, after, set(map(str, doc))


def _spliced(tuned: TunedFolder, details: dict) -> str:
    path = tuned.path / SERVER_ARGS
    before, after, flags = _user_flags(path)
    ours = render(details, path, flags, tuned.real(path))
    head = "\n".join(before).rstrip("\n")
    return (head + "\n\n" if head else "") + ours + ("\n".join(after) + "\n" if after else "")


def _read(path: Path) -> dict:
    """A backend_choice.json, its families' provenance filled in where an older file lacks it."""
    try:
        choices = load_json(path)
        from autotune.folder.config_files import choices_problem
        why = choices_problem(choices)
        if why:
            raise TypeError(why)
        kind, families = DeviceInfo.from_dict(choices["device"]).kind, choices["families"]
    except FileNotFoundError:
        raise ChoicesError(f"{path}: no such file") from None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ChoicesError(f"{path} cannot be read ({e}); move it away to start this folder afresh") from None
    for entry in families.values():        # written before sections carried their own provenance
        entry.setdefault("measured", {"on": kind, "date": choices.get("date", "?")})
    return choices


def _existing(folder: Path, device: DeviceInfo) -> dict:
    path = folder / DETAILS
    if path.is_dir():
        raise ChoicesError(f"{path} is a folder, not a backend_choice.json")
    if not path.exists():
        return {}
    old = _read(path)
    if old["device"]["name"] != device.name:
        raise ChoicesError(f"{path} holds choices for {old['device']['name']}, not {device.name}")
    return old


def _replayed(kind_or_on: str) -> bool:
    return "replay" in str(kind_or_on)


def check_kinds(old: dict, families: dict, path: Path) -> None:
    """GPU-measured choices and replayed ones are never mixed in one folder (as export refuses for configs)."""
    for name, entry in old.get("families", {}).items():
        was = _replayed(entry.get("measured", {}).get("on", ""))
        for new_name, new in families.items():
            if _replayed(new.get("measured", {}).get("on", "")) != was:
                raise ChoicesError(f"{path} holds {name} {'replayed' if was else 'measured on a GPU'}; "
                                   f"{new_name} {'measured on a GPU' if was else 'replayed'} is not mixed into it "
                                   "(choose another --out)")


def _render_checked(details: dict, tuned: TunedFolder) -> str:
    try:
        return _spliced(tuned, details)
    except (KeyError, TypeError, ValueError, StopIteration, ZeroDivisionError) as e:
        raise ChoicesError(f"{tuned.path / DETAILS} holds a family without a readable choice "
                           f"({type(e).__name__}: {e}); move it away to start this folder afresh") from None


def check_folder(tuned: TunedFolder) -> None:
    """Raises ChoicesError where the tuned folder holds a backend_choice.json a run could not merge into."""
    old = _existing(tuned.path, tuned.device)
    if old:
        _render_checked({"date": "", **old}, tuned)
    else:
        _user_flags(tuned.path / SERVER_ARGS)        # a hand-written file's lines must be readable to be kept


def merge(tuned: TunedFolder, device: DeviceInfo, families: dict, checkpoint: str | None = None) -> Path:
    """Fold `families` (name -> entry with server_choice, per-problem details and `measured`) of `device` into
    the tuned folder's backend_choice.json, replacing those families and keeping the others, and render
    server_args.yaml from the result. Returns the YAML path."""
    write_all(_merged(tuned, device, families, checkpoint))
    return tuned.path / SERVER_ARGS


def _merged(tuned: TunedFolder, device: DeviceInfo, families: dict, checkpoint: str | None) -> Files:
    """backend_choice.json and server_args.yaml of `families` merged into the folder, in memory: every
    refusal (ChoicesError) comes before anything is written."""
    folder = tuned.path
    old = _existing(folder, device)
    check_kinds(old, families, folder / DETAILS)
    merged = {**old.get("families", {}), **families}
    # The file lists the sections in the run's order reversed: the dense GEMM flags first, the MoE
    # runner (one per expert dtype) last, as it always did; a family this release does not know, by name.
    sections = registry.names(registry.BACKENDS)[::-1]
    merged = {n: merged[n] for n in sorted(merged, key=lambda n: (sections.index(n) if n in sections else 99, n))}
    moe = [n for n in merged if flag_of(n) == MOE_FLAG]
    new_moe = [n for n in families if n in moe]
    # the explicit choice, else this run's MoE family, else what the folder said before
    keep = checkpoint or (new_moe[0] if new_moe else None) or old.get("checkpoint")
    details = {"device": device.to_dict(), "date": utc_now(), "mixes": list(MIXES),
               "checkpoint": keep if keep in moe else (moe[0] if moe else None), "families": merged}
    text = _render_checked(details, tuned)      # every line the user wrote is in it
    files = {folder / DETAILS: (json_bytes(details), DETAILS_OURS), folder / SERVER_ARGS: (text.encode(), None)}
    if old and _undated(details) == _undated(old):
        # Nothing changed: the folder keeps its bytes (a new date, or the folder named another way in the
        # load line, made it differ from what its validation judged, and publish refused it). Only a
        # server_args.yaml without our section is written.
        kept = {folder / DETAILS} | ({folder / SERVER_ARGS} if _has_section(folder / SERVER_ARGS) else set())
        files = {path: v for path, v in files.items() if path not in kept}
    return files


def _undated(details: dict) -> dict:
    return {k: v for k, v in details.items() if k != "date"}


def _has_section(path: Path) -> bool:
    try:
        return any(line.startswith(BEGIN) for line in read_text(path).splitlines())
    except (OSError, UnicodeDecodeError):
        return False


def write(tuned: TunedFolder, results: list[tuple[list[ServerChoice], object]], moe_family: str | None,
          problems: dict) -> Path:
    """One run's results on the folder's device: per family, (its ServerChoices, the chosen one first; the
    family); `problems`: family name -> per-problem details. Merged into what the folder holds."""
    device = tuned.device
    measured = {"on": device.kind + (" (replayed from a recorded cache)" if device.is_replay else ""),
                "date": utc_now()}
    families = {}
    for choices, family in results:
        name = choices[0].family
        families[name] = {**problems.get(name, {}), "chosen_mix": choices[0].mix, "measured": measured,
                          "server_choice": {c.mix: choice_record(c, family) for c in choices}}
    return merge(tuned, device, families, moe_family)


def merge_folder(src: str | Path, tuned: TunedFolder) -> Path:
    """Fold another folder's (or backend_choice.json's) families into the tuned folder of their device: how
    the results of separate runs on one GPU model (one per kernel family, say) become one file."""
    other = read_source(src)
    device = DeviceInfo.from_dict(other["device"])
    return merge(tuned, device, other["families"], other.get("checkpoint"))


def merged_from(src: str | Path, tuned: TunedFolder) -> Files:
    """Another folder's families merged into exactly the folder `tuned` (a serving repo's folder need not be
    named after the device), in memory: publish writes it with its other files once all are checked."""
    other = read_source(src)
    device = DeviceInfo.from_dict(other["device"])
    return _merged(tuned, device, other["families"], other.get("checkpoint"))


def read_source(src: str | Path) -> dict:
    """The backend choices of a tuned folder or a backend_choice.json, to be merged elsewhere."""
    src = Path(src)
    other = _read(src / DETAILS if src.is_dir() else src)
    if not isinstance(other["families"], dict) or not other["families"]:
        raise ChoicesError(f"{src} holds no backend choices")
    return other


def check_merge(sources: list, out: str | Path) -> None:
    """merge-choices, before anything is written: one GPU model among the sources, and each source's
    families mergeable into `out`/<device>."""
    got = [(s, read_source(s)) for s in sources]
    names = {o["device"].get("name") for _, o in got}
    if len(names) > 1:
        raise ChoicesError(f"the sources hold choices of {len(names)} GPU models ({', '.join(sorted(map(str, names)))}); "
                           "merge the folders of one GPU model at a time")
    for s, other in got:
        device = DeviceInfo.from_dict(other["device"])
        folder = TunedFolder.under(out, device).path
        check_kinds(_existing(folder, device), other["families"], folder / DETAILS)
        _user_flags(folder / SERVER_ARGS)


def read_values(path: str | Path) -> dict:
    """The flag -> value pairs of a server_args.yaml (what SGLang's --config loader sees)."""
    return parse_yaml(read_text(path)) or {}
