"""server_args.yaml: the backend choices as SGLang's `--config` file, every line explained.

One key per server flag. Several MoE families map to the same flag (--moe-runner-backend): the
file carries the one matching the checkpoint's expert precision (`moe_family`), the others stay
as comments so one file serves whoever reads it. The full numbers go to backend_choice.json.
"""
from __future__ import annotations

from pathlib import Path

from ..choice import MIXES, ServerChoice
from ..device import DeviceInfo, utc_now
from ..fsutil import write_atomic, write_json
from ..backends import FAMILY_FLAGS

SERVER_ARGS = "server_args.yaml"
DETAILS = "backend_choice.json"
MIX_TEXT = {"decode": "decode mix (M <= 64)", "prefill": "prefill mix (M >= 512)"}


def _lines(c: ServerChoice, family) -> list[str]:
    out = [f"# {c.family}: {MIX_TEXT.get(c.mix, c.mix)}, time summed over the model's problems"]
    for b, total in sorted(c.totals.items(), key=lambda kv: kv[1]):
        tags = []
        if b == c.backend:
            tags.append("chosen")
        if b == c.auto:
            tags.append("SGLang auto")
        if not family.sglang_value(b):
            tags.append("not selectable in SGLang")
        ratio = f" ({total / c.totals[c.backend]:.3f}x the chosen)" if c.backend and b != c.backend else ""
        out.append(f"#   {b}: {total:.1f} us{ratio}" + (f"  [{', '.join(tags)}]" if tags else ""))
    if c.gain_vs_auto is not None:
        out.append(f"#   gain over SGLang's auto ({c.auto}): {c.gain_vs_auto:.3f}x")
    elif c.auto:
        why = c.disqualified.get(c.auto) or c.skipped.get(c.auto) or "not measured on every problem"
        out.append(f"#   SGLang's auto ({c.auto}) is not usable here: {why}")
    if c.per_m_gain is not None:
        out.append(f"#   choosing per M instead of one backend would gain {c.per_m_gain:.3f}x")
    for b, why in sorted(c.disqualified.items()):
        out.append(f"#   disqualified {b}: {why}")
    for b, why in sorted(c.skipped.items()):
        out.append(f"#   skipped {b}: {why}")
    return out


def write(out: str | Path, device: DeviceInfo, choices: list[tuple[ServerChoice, object]],
          moe_family: str | None, details: dict) -> Path:
    """`choices`: (ServerChoice, family) pairs. Returns the YAML path."""
    folder = Path(out) / device.file_name
    lines = [f"# autotune: SGLang server arguments for {device.name} (SM{device.sm}), {utc_now()}",
             f"# measured on: {device.kind}" + (" (replayed from a recorded cache)" if device.is_replay else ""),
             f"# load with: python -m sglang.launch_server --config {folder / SERVER_ARGS} ...", ""]
    moe = [c for c, _ in choices if FAMILY_FLAGS[c.family] == "moe-runner-backend"]
    keep_moe = moe_family or (moe[0].family if moe else None)
    for c, family in choices:
        flag = FAMILY_FLAGS[c.family]
        lines += _lines(c, family)
        value = family.sglang_value(c.backend) if c.backend else None
        if value is None:
            lines.append(f"# {flag}: no backend SGLang can select ran correctly everywhere; SGLang's default stays")
        elif flag == "moe-runner-backend" and c.family != keep_moe:
            lines.append(f"# {flag}: {value}    # for {c.family.split('_', 1)[1]} experts (this file is for {keep_moe})")
        else:
            lines.append(f"{flag}: {value}")
        lines.append("")
    path = folder / SERVER_ARGS
    write_atomic(path, "\n".join(lines))
    write_json(folder / DETAILS, {"device": device.to_dict(), "date": utc_now(), "mixes": list(MIXES), **details})
    return path


def read_values(path: str | Path) -> dict:
    """The flag -> value pairs of a server_args.yaml (what SGLang's --config loader sees)."""
    import yaml

    return yaml.safe_load(Path(path).read_text()) or {}
