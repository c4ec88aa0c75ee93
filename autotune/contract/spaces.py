"""Search spaces: YAML ladders per kernel family, resolved for an architecture and a GEMM."""
from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import yaml

from autotune.contract.config import KernelConfig
from autotune.gpus.catalog import arch_section
from autotune.fileio.reading import parse_yaml, read_text

# search_spaces/ at the top of a checkout; an installed wheel carries it inside the package.
_PACKAGE = Path(__file__).resolve().parents[1]          # autotune/
SPACES_DIR = _PACKAGE.parent / "search_spaces"
if not SPACES_DIR.is_dir():
    SPACES_DIR = _PACKAGE / "search_spaces"
_TOP_KEYS = {"family", "params", "gemm_params", "arch"}
_ARCH_KEYS = {"params"}
_ARCH_NAME = re.compile(r"sm[0-9]{2,3}")


class SpaceError(ValueError):
    pass


@dataclass(frozen=True)
class Space:
    """Ordered value ladders; a config is one value per parameter."""

    family: str
    params: dict  # name -> tuple of values, in ladder order

    def size(self) -> int:
        n = 1
        for v in self.params.values():
            n *= len(v)
        return n

    def configs(self) -> list[KernelConfig]:
        """Every config of the space, in ladder order (made once: the search walks them again and again)."""
        return self._all

    @cached_property
    def _all(self) -> list[KernelConfig]:
        names = list(self.params)
        return [KernelConfig.from_entry(dict(zip(names, combo)))
                for combo in itertools.product(*(self.params[n] for n in names))]

    def indices_of(self, config: KernelConfig) -> dict | None:
        """Ladder positions of a config, or None when it is not in this space."""
        if set(config) - set(self.params) and any(config.get(k) for k in set(config) - set(self.params)):
            return None
        out = {}
        for name, ladder in self.params.items():
            value = config.get(name, False if isinstance(ladder[0], bool) else None)
            if value not in ladder:
                return None
            out[name] = ladder.index(value)
        return out

    def config_at(self, indices: dict) -> KernelConfig:
        """The config at ladder positions `indices` (a study's trial's parameters)."""
        return KernelConfig.from_entry(self.entry_at(indices))

    def entry_at(self, indices: dict) -> dict:
        """What a study's trial shows people reading it: every ladder's value at `indices`, in ladder order."""
        return {name: self.params[name][int(indices[name])] for name in self.params}


def _check_ladders(where: str, params) -> dict:
    if not isinstance(params, dict):
        raise SpaceError(f"{where}: expected a mapping of parameter -> list of values")
    out = {}
    for name, values in params.items():
        if not isinstance(values, list) or not values:
            raise SpaceError(f"{where}.{name}: expected a non-empty list of values")
        odd = [v for v in values if not isinstance(v, (bool, int, float, str))]
        if odd:
            raise SpaceError(f"{where}.{name}: a ladder holds numbers or true/false, got {odd[0]!r:.60}")
        if len(set(values)) != len(values):
            raise SpaceError(f"{where}.{name}: repeated values {values}")
        out[str(name)] = tuple(values)
    return out


def load(family: str, path: str | Path | None = None, gemms: tuple[str, ...] = ()) -> dict:
    """Read and validate search_spaces/<family>.yaml (or `path`); `gemms`: the family's GEMMs, the only
    names gemm_params may hold (a misspelt one would be ignored in silence)."""
    p = Path(path) if path else SPACES_DIR / f"{family}.yaml"
    try:
        doc = parse_yaml(read_text(p))
    except FileNotFoundError:
        raise SpaceError(f"search space file not found: {p}") from None
    except IsADirectoryError:
        raise SpaceError(f"--search-space {p} is a folder; name a YAML file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise SpaceError(f"search space {p} cannot be read: {e}") from None
    except yaml.YAMLError as e:
        raise SpaceError(f"{p}: not valid YAML: {e}") from None
    if not isinstance(doc, dict):
        raise SpaceError(f"{p}: expected a mapping at top level")
    unknown = set(doc) - _TOP_KEYS
    if unknown:
        raise SpaceError(f"{p}: unknown key(s) {sorted(unknown)}; allowed: {sorted(_TOP_KEYS)}")
    if doc.get("family") != family:
        raise SpaceError(f"{p}: family is {doc.get('family')!r}, expected {family!r}")
    base = _check_ladders(f"{p}:params", doc.get("params"))
    for key in ("gemm_params", "arch"):
        if not isinstance(doc.get(key) or {}, dict):
            raise SpaceError(f"{p}: {key} must be a mapping, got {doc[key]!r:.60}")
    gemm = {g: _check_ladders(f"{p}:gemm_params.{g}", v) for g, v in (doc.get("gemm_params") or {}).items()}
    if gemms and set(gemm) - set(gemms):
        raise SpaceError(f"{p}: gemm_params names unknown GEMM(s) {sorted(map(str, set(gemm) - set(gemms)))}; "
                         f"{family}'s are {list(gemms)}")
    arch = {}
    for a, sec in (doc.get("arch") or {}).items():
        if not isinstance(a, str) or not _ARCH_NAME.fullmatch(a):
            raise SpaceError(f"{p}: arch.{a} is not an architecture section: name one sm<NN> as the device's "
                             "compute capability (sm90, sm100, sm120)")
        if arch_section(int(a[2:])) != a:
            raise SpaceError(f"{p}: arch.{a} is never read: {a.upper()} devices read section "
                             f"{arch_section(int(a[2:]))}; name that one")
        sec = sec or {}
        if not isinstance(sec, dict):
            raise SpaceError(f"{p}: arch.{a} must be a mapping (params: ...), got {sec!r:.60}")
        if set(sec) - _ARCH_KEYS:
            raise SpaceError(f"{p}: arch.{a}: unknown key(s) {sorted(set(sec) - _ARCH_KEYS)}; allowed: {sorted(_ARCH_KEYS)}")
        over = _check_ladders(f"{p}:arch.{a}.params", sec.get("params") or {})
        bad = set(over) - set(base) - {k for g in gemm.values() for k in g}
        if bad:
            raise SpaceError(f"{p}: arch.{a} overrides unknown parameter(s) {sorted(bad)}")
        arch[str(a)] = over
    return {"path": str(p), "params": base, "gemm_params": gemm, "arch": arch}


@dataclass(frozen=True)
class Rule:
    """The values a family's kernel takes for one parameter: its type, bounds, and whether it must be
    a power of two; `why` names the kernel's reason, said with a value it would not take."""
    type: type = int
    least: int | None = None
    most: int | None = None
    power_of_two: bool = False
    why: str = ""

    def problem(self, v) -> str | None:
        if type(v) is not self.type:
            kind = "true/false" if self.type is bool else "positive integers" if (self.least or 0) >= 1 else "integers"
            return f"must hold {kind}, got {v!r}"
        if self.type is bool:
            return None
        if (self.least is not None and v < self.least) or (self.most is not None and v > self.most):
            kind = "powers of two" if self.power_of_two else "integers"
            bounds = (f"{kind} from {self.least} to {self.most}" if self.least is not None and self.most is not None
                      else "positive integers" if self.least == 1 else
                      f"{kind} of at least {self.least}" if self.least is not None else f"{kind} of at most {self.most}")
            return f"must hold {bounds}, got {v!r}" + (f" ({self.why})" if self.why else "")
        if self.power_of_two and v & (v - 1):
            return f"must hold powers of two, got {v!r}" + (f" ({self.why})" if self.why else "")
        return None


def check_params(space: Space, where: str, gemm: str, rules: dict, optional=()) -> None:
    """The family's parameters, each a ladder of values its kernel takes (`rules`: name -> Rule, or a
    type for any value of it; bool is not an int here)."""
    unknown = sorted(set(space.params) - set(rules))
    if unknown:
        raise SpaceError(f"{where}: unknown parameter(s) {unknown} for {space.family}; known: {sorted(rules)}")
    missing = sorted(set(rules) - set(space.params) - set(optional))
    if missing:
        raise SpaceError(f"{where}: no ladder for {missing} ({gemm} GEMM); every one of {sorted(set(rules) - set(optional))} "
                         "needs one")
    for name, ladder in space.params.items():
        rule = rules[name] if isinstance(rules[name], Rule) else Rule(rules[name])
        for v in ladder:
            why = rule.problem(v)
            if why:
                raise SpaceError(f"{where}: {name} {why}")


def resolve(doc: dict, family: str, arch: str, gemm: str) -> Space:
    """The ladders for one architecture section and one GEMM."""
    params = dict(doc["params"])
    params.update(doc["gemm_params"].get(gemm, {}))
    for name, ladder in doc["arch"].get(arch, {}).items():
        if name in params:
            params[name] = ladder
    return Space(family=family, params=params)
