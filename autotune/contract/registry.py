"""The kernel families a run tunes, found where they are declared, as autotune.contract.runner.discover finds
backends: nothing here lists a family.

A family is a package whose `FAMILY` (a class) or `FAMILIES` (several) is its protocol object's class
(autotune.contract.protocol.KernelFamily), and that class carries its declaration:
- `name`: what --kernels calls it;
- `step`: what the run does with it: CONFIGS, a search of configs per (GEMM, M) written as the family's
  files (autotune.search.study, the family's `select` and `export`); BACKENDS, every backend measured and one
  chosen per server, written as server_args.yaml (autotune.search.sieve, autotune.export.server_args);
- `problems`: which call sites of the model it tunes: MOE, the fused-MoE layers (models.expand), DENSE, the
  dense GEMMs (models.dense_gemms);
- `dtype`: the one dtype it tunes, or None for the dtypes --dtype names (default: every dtype of SGLang's
  Triton fused MoE, models.TRITON_DTYPES);
- `flag`, `sglang_choices`: the SGLang server flag its choice is written to and the name of SGLang's list of
  that flag's values (sglang.srt.arg_groups.choices), for BACKENDS families;
- `options`: the run settings its protocol object is built with (RUN_OPTIONS);
- `order`: where a run takes it among the others (a config search comes before the backend choices, whose
  MoE runners run with the configs it wrote); a family that gives none comes after those that do.
The package that declares a BACKENDS family is where its backends are declared, one module each.

Where families are found:
- in the tree: every subpackage of autotune.families that declares one;
- plugged in: every package an installed distribution names in the entry-point group "autotune.families"
  (importlib.metadata), e.g. in its pyproject.toml: [project.entry-points."autotune.families"] toy = "toy".
Everything else derives from the declarations: the --kernels names and order, the capability table's flags
and runner packages, plan's problems per family, the options each family is built with, the step that
runs it, the key order of the configs the records write.
"""
from __future__ import annotations

import importlib
import pkgutil
import sys
from importlib.metadata import entry_points

from autotune.errors import UsageError

CONFIGS = "configs"          # a config search per (GEMM, M): the family's config files
BACKENDS = "backends"        # every backend measured, one per server: server_args.yaml
MOE = "moe"                  # the fused-MoE layers of the chosen models
DENSE = "dense"              # their dense GEMMs (attention projections, shared experts...)
GROUP = "autotune.families"  # the entry-point group of plugged-in families
# The package whose subpackages are the families in the tree: found by name, as a plugged-in package is (the
# contract sits below the families and imports none of them).
IN_TREE = "autotune.families"

# What a run hands each family's constructor, by the names a family's `options` lists:
#   space_path       the --search-space file (None: the family's own)
#   sglang_versions  the SGLang releases the files must run in (--sglang-version)
#   triton_config_dir  the tuned folder of this run, whose Triton MoE configs a layer runs with
#   skip             the backends --skip-backends leaves out of this family
RUN_OPTIONS = ("space_path", "sglang_versions", "triton_config_dir", "skip")
UNORDERED = 1000             # the `order` of a family that declares none


class FamilyError(UsageError):
    """A package declares a family wrongly, or two declare one name: one line, exit 2."""


class Family:
    """One family's declaration, read from its class and checked (where the class gives none: no dtype, flag
    or options, UNORDERED); `package`: the one that declares it, whose modules declare a backend choice's
    backends."""

    def __init__(self, cls: type, package: str):
        missing = [a for a in ("name", "step", "problems") if not hasattr(cls, a)]
        if missing:
            raise FamilyError(f"{package} declares {cls.__module__}.{cls.__qualname__} as a kernel family, which "
                              f"has no {', '.join(missing)}")
        self.cls, self.name, self.step, self.problems = cls, cls.name, cls.step, cls.problems
        self.dtype, self.flag = getattr(cls, "dtype", None), getattr(cls, "flag", None)
        self.sglang_choices = getattr(cls, "sglang_choices", None)
        self.options, self.order = tuple(getattr(cls, "options", ())), getattr(cls, "order", UNORDERED)
        self.runners = package if self.step == BACKENDS else None
        self._check()

    def _check(self) -> None:
        where = f"kernel family {self.name!r} ({self.cls.__module__}.{self.cls.__qualname__})"
        for ok, why in ((self.step in (CONFIGS, BACKENDS), f"step {self.step!r} is not {CONFIGS!r} or {BACKENDS!r}"),
                        (self.problems in (MOE, DENSE), f"problems {self.problems!r} is not {MOE!r} or {DENSE!r}"),
                        (set(self.options) <= set(RUN_OPTIONS), f"options {self.options} are not among {RUN_OPTIONS}"),
                        ((self.step == BACKENDS) == (self.flag is not None), "a backend choice, and only one, names its flag"),
                        (self.problems == MOE or self.dtype, "dense GEMMs are tuned at one dtype: declare it")):
            if not ok:
                raise FamilyError(f"{where}: {why}")


def declared(package) -> list[Family]:
    """The families `package` (an imported module) declares: its FAMILY or FAMILIES."""
    classes = getattr(package, "FAMILIES", ()) or ([package.FAMILY] if hasattr(package, "FAMILY") else [])
    return [Family(cls, package.__name__) for cls in classes]


def _packages():
    """(where it came from, the imported package, whether it must declare one) of every package that may
    declare families: a subpackage of the tree's may hold something else, a plugged-in package may not."""
    here = importlib.import_module(IN_TREE)
    for info in sorted(pkgutil.iter_modules(here.__path__), key=lambda m: m.name):
        if info.ispkg:
            yield f"{IN_TREE}.{info.name}", importlib.import_module(f"{IN_TREE}.{info.name}"), False
    for ep in sorted(entry_points(group=GROUP), key=lambda e: e.name):
        where = f"the {GROUP} entry point {ep.name} = {ep.value}"
        try:
            package = ep.load()
        except Exception as e:
            raise FamilyError(f"{where} does not load: {type(e).__name__}: "
                              f"{str(e).splitlines()[0] if str(e) else ''}") from None
        yield where, package, True


def _discover() -> dict[str, Family]:
    found: dict[str, tuple[str, Family]] = {}
    for where, package, plugged in _packages():
        here = declared(package)
        if plugged and not here:
            raise FamilyError(f"{where} declares no kernel family (a FAMILY or FAMILIES class there)")
        for f in here:
            if f.name in found:
                raise FamilyError(f"{where} declares kernel family {f.name!r}, which {found[f.name][0]} declares "
                                  "already: one name, one family")
            found[f.name] = (where, f)
    return {f.name: f for _, f in sorted(found.values(), key=lambda wf: wf[1].order)}


_found: tuple = (None, {})     # (sys.path they were found on, name -> Family)


def families() -> dict[str, Family]:
    """name -> declaration of every family, in the order a run takes them. Found again where sys.path
    changed (a distribution that plugs one in was put on it)."""
    global _found
    path = tuple(sys.path)
    if _found[0] != path:
        _found = (path, _discover())
    return _found[1]


def names(step: str | None = None) -> tuple[str, ...]:
    """Every family (of one step), in the order a run takes them."""
    return tuple(n for n, f in families().items() if step is None or f.step == step)


def get(name: str) -> Family:
    try:
        return families()[name]
    except KeyError:
        raise KeyError(f"unknown kernel family {name!r}; known: {', '.join(families())}") from None


def default(step: str = CONFIGS) -> str:
    """The family the commands that name none work on (`worker`, `export`, `record`, `shapes`,
    `compile-limits`, --warm-start, --only-drifted): the first of `step` in run order."""
    return names(step)[0]


def with_flag(flag: str) -> tuple[str, ...]:
    """The families whose choice goes to SGLang's `flag` (moe-runner-backend: one per expert dtype)."""
    return tuple(n for n, f in families().items() if f.flag == flag)


def key_order() -> tuple[tuple[str, ...], frozenset]:
    """(config keys in the order the families declare them, the keys that are switches): how the records
    write a config (autotune.measure.records.canonical). Each family's `config_order` and `config_switches`,
    the first family's first."""
    global _keys
    table = families()
    if _keys[0] is not table:
        order = dict.fromkeys(k for f in table.values() for k in getattr(f.cls, "config_order", ()))
        switches = frozenset(k for f in table.values() for k in getattr(f.cls, "config_switches", ()))
        _keys = (table, (tuple(order), switches))
    return _keys[1]


_keys: tuple = (None, ((), frozenset()))     # (the families they were read from, key_order())
