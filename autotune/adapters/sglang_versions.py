"""Which SGLang releases load and run the fused-MoE files we write: one table, read from each
release's own source (the functions are cited), and the rules export and `check` apply with it.

A tuned file is a JSON of per-M configs that SGLang's loader returns and its fused-MoE runner
turns into kernel arguments. Releases differ in what that runner accepts:

- `USE_TMA` in the up-projection (gate_up) file: from 0.5.18 `_prepare_fused_moe_run` pops it and
  loads the weights by TMA (`up_moe_use_tma`); 0.5.16 and 0.5.17 pass the up config to
  `invoke_fused_moe_kernel` as it is, which hands it to the Triton kernel as keyword arguments:
  `KeyError: 'Keyword argument USE_TMA was specified but unrecognised'` during CUDA-graph capture
  (seen in 0.5.16's server on the H200).
- `USE_TMA` in the `_down` file: every supported release pops it (`down_moe_use_tma`). 0.5.16 and
  0.5.17 pop it only where `support_tensor_descriptor()` holds (SM90+ with Triton's descriptors);
  elsewhere the key reaches the kernel and crashes it as above.
- `_down` files themselves (`get_config_file_name(..., down_moe=True)`, `return_down_config=True`)
  are read by every release in the table.

A folder is valid for a release when every config in every file passes that release's rules; a
file's provenance lists those releases, and `check` refuses a folder that does not cover the
SGLang version installed where it will be served.
"""
from __future__ import annotations

from collections.abc import Mapping

import re
from dataclasses import dataclass

# The same modules in every release of the table (read from each wheel):
LOADER = "sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe_triton_config"
RUNNER = "sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe"
KERNELS = "sglang.kernels.ops.moe.fused_moe_triton_kernels"


class VersionError(ValueError):
    """A version or range we cannot serve: one line, exit 2."""


@dataclass(frozen=True)
class Release:
    version: str
    up_tma: bool          # gate_up file may carry USE_TMA (popped and honoured)
    down_tma_needs_descriptors: bool   # down USE_TMA reaches the kernel where TMA is unsupported
    source: str           # where the behaviour is read from

    def config_problem(self, config: Mapping, gemm: str, tma_capable: bool = True) -> str | None:
        """Why this release cannot run `config` (a KernelConfig, or an entry of a file) from the `gemm` file, or None."""
        if not config.get("USE_TMA"):
            return None
        if gemm == "gate_up" and not self.up_tma:
            return (f"SGLang {self.version} passes the up-projection config to the Triton kernel as keyword "
                    "arguments: USE_TMA there crashes it ('Keyword argument USE_TMA was specified but unrecognised')")
        if gemm == "down" and self.down_tma_needs_descriptors and not tma_capable:
            return (f"SGLang {self.version} keeps USE_TMA in the down config on GPUs without TMA descriptors "
                    "and passes it to the kernel, which rejects it")
        return None


_OLD = ("srt/layers/moe/moe_runner/triton_utils/fused_moe.py: _prepare_fused_moe_run pops USE_TMA from "
        "down_config only (`_down_moe_use_tma() and down_config.pop(\"USE_TMA\", False)`); the up config goes "
        "to invoke_fused_moe_kernel(..., config, ...) unchanged")
_NEW = ("srt/layers/moe/moe_runner/triton_utils/fused_moe.py: _prepare_fused_moe_run copies the up config and "
        "pops USE_TMA from both (`up_tma_requested = config.pop(\"USE_TMA\", False)`, "
        "`down_tma_requested = ... down_config.pop(\"USE_TMA\", False)`)")
RELEASES: dict[str, Release] = {r.version: r for r in (
    Release("0.5.16", False, True, _OLD),
    Release("0.5.17", False, True, _OLD),
    Release("0.5.18", True, False, _NEW),
    Release("0.5.19", True, False, _NEW),
    Release("0.5.20", True, False, _NEW),
    Release("0.5.21", True, False, _NEW),
    Release("0.5.22", True, False, _NEW),
    Release("0.5.23", True, False, _NEW),
)}
SUPPORTED = tuple(RELEASES)


def release_key(v: str) -> tuple:
    """A release's (major, minor, patch), for ordering releases."""
    return tuple(int(x) for x in re.findall(r"\d+", v)[:3])


def installed() -> str | None:
    """The SGLang release installed here (package metadata, no import), or None."""
    import importlib.metadata as md
    try:
        return md.version("sglang")
    except md.PackageNotFoundError:
        return None


def release(version: str) -> Release:
    base = ".".join(str(x) for x in release_key(version)) if re.fullmatch(r"\d+\.\d+\.\d+(\.?post\d+|rc\d+)?", version, re.ASCII) else None
    if base not in RELEASES:
        raise VersionError(f"SGLang {version!r} is not a supported release (supported: {SUPPORTED[0]} to "
                           f"{SUPPORTED[-1]}: {', '.join(SUPPORTED)})")
    return RELEASES[base]


def parse_targets(spec: str | None) -> tuple[str, ...]:
    """`--sglang-version`: a release, a comma list, or a range A-B / A..B; default the installed one."""
    if spec is None or not spec.strip():
        v = installed()
        if v is None:
            raise VersionError("SGLang is not installed here: name the serving release with --sglang-version")
        return (release(v).version,)
    out: list[str] = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            raise VersionError(f"--sglang-version {spec!r} has an empty entry")
        ends = re.split(r"\.\.|-", part, maxsplit=1)
        if len(ends) == 2:
            lo, hi = release(ends[0].strip()).version, release(ends[1].strip()).version
            if release_key(lo) > release_key(hi):
                raise VersionError(f"--sglang-version range {part!r} is empty ({lo} is after {hi})")
            out += [v for v in SUPPORTED if release_key(lo) <= release_key(v) <= release_key(hi)]
        else:
            out.append(release(part).version)
    return tuple(sorted(set(out), key=release_key))


def config_problem(config: Mapping, gemm: str, targets, tma_capable: bool = True) -> str | None:
    """The first target release that cannot run `config` from the `gemm` file, and why."""
    for v in targets:
        why = RELEASES[v].config_problem(config, gemm, tma_capable)
        if why:
            return why
    return None


def valid_releases(up: dict, down: dict, tma_capable: bool = True) -> list[str]:
    """Every supported release that runs every entry of this (gate_up file, down file) pair."""
    return [v for v, r in RELEASES.items()
            if all(r.config_problem(c, "gate_up", tma_capable) is None for c in up.values())
            and all(r.config_problem(c, "down", tma_capable) is None for c in down.values())]
