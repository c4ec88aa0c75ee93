"""A kernel config as one value, as Triton's `Config` is: the kernel's meta-parameters (its tile sizes, its
switches) and the launch's num_warps and num_stages, always both. A dict is what a file holds (an entry of
SGLang's config files, a record's config): `KernelConfig.from_entry` reads one, `to_entry` writes one, in the
families' key order (`canonical`), so two configs that launch the same kernel are one value.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping

from autotune.contract.registry import key_order

LAUNCH = ("num_warps", "num_stages")


def canonical(config: Mapping) -> dict:
    """Config in its family's key order, other keys after in sorted order; a switch only when on (the files
    a family writes read an absent switch as off). The order is the families' declarations
    (autotune.contract.registry.key_order): the records never name a family's keys."""
    order, switches = key_order()
    out = {k: config[k] for k in order if k in config and not (k in switches and not config[k])}
    out.update({k: v for k, v in sorted(config.items()) if k not in out and not (k in switches and not v)})
    return out


@dataclass(frozen=True)
class KernelConfig:
    params: tuple[tuple[str, int | bool], ...]     # the meta-parameters, canonical: in key order, switches when on
    num_warps: int
    num_stages: int

    @classmethod
    def from_entry(cls, entry: Mapping, launch: Mapping | None = None) -> KernelConfig:
        """The config a file's entry launches: its num_warps and num_stages, else `launch`'s (what Triton
        launches with where a config leaves them out: SGLang's default config and its shipped files do)."""
        full = {**(launch or {}), **entry}
        missing = [k for k in LAUNCH if k not in full]
        if missing:
            raise ValueError(f"{dict(entry)} names no {' and no '.join(missing)}, and no launch default is given")
        return cls(tuple(canonical({k: v for k, v in full.items() if k not in LAUNCH}).items()),
                   full["num_warps"], full["num_stages"])

    def to_entry(self) -> dict:
        """The entry a file holds: every meta-parameter, num_warps and num_stages, in the files' key order."""
        return canonical({**dict(self.params), "num_warps": self.num_warps, "num_stages": self.num_stages})

    def __getitem__(self, name: str):
        return dict(self.params)[name] if name not in LAUNCH else getattr(self, name)

    def with_params(self, **params) -> KernelConfig:
        """This config with some meta-parameters changed (a second GEMM sharing a tile size with its first)."""
        return replace(self, params=tuple(canonical({**dict(self.params), **params}).items()))
