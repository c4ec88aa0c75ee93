"""A kernel config as one value, as Triton's `Config` is: the kernel's meta-parameters (a Triton kernel's tile
sizes and switches, a backend family's backend and tactic) and the launch's num_warps and num_stages as fields
of their own. Every config the core holds is one (a study's ask, a task, a measurement, a finalist, a pick); a
dict is what a file holds (an entry of SGLang's config files, a record in a recording or a study):
`KernelConfig.from_entry` reads one, `to_entry` writes one, in the families' key order (`canonical`), so two
entries that name the same values are one value, and `key` is its identity in caches and studies.

num_warps and num_stages are None where the config leaves them to the launcher (SGLang's default config and
some of its shipped files do; Triton then launches with its own defaults). Such a config stays what it says,
and a record of it stays that record: `launched(defaults)` states both, and every file the families write
states both.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

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


class _Object(tuple):
    """A JSON object inside a value (a compound tactic's part), frozen as its (key, value) pairs: never equal to
    a frozen list (an empty object is not an empty list)."""

    def __eq__(self, other):
        return type(other) is _Object and tuple.__eq__(self, other)

    def __ne__(self, other):
        return not self == other

    def __hash__(self):
        return hash((_Object, tuple(self)))


_SCALARS = (int, bool, float, str, type(None))


def _freeze(value):
    """A JSON value as a hashable one (lists as tuples, objects as _Object), `_thaw` its inverse."""
    if type(value) in _SCALARS:
        return value
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, Mapping):
        return _Object((k, _freeze(v)) for k, v in value.items())
    return value


def _thaw(value):
    if type(value) in _SCALARS:
        return value
    if isinstance(value, _Object):
        return {k: _thaw(v) for k, v in value}
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    return value


@dataclass(frozen=True, init=False)
class KernelConfig(Mapping):
    """Made by `from_entry` only (one place turns an entry into the value)."""
    params: tuple[tuple[str, Any], ...]     # the meta-parameters, canonical: in key order, switches when on
    num_warps: int | None                   # None: left to the launcher (Triton's default)
    num_stages: int | None
    # Read as a mapping of its entry (config[name], config.get(name, default), {**config}): what a family's
    # launch reads, never a dict to change.
    _entry: dict = field(repr=False, compare=False, hash=False)

    @classmethod
    def from_entry(cls, entry: Mapping, launch: Mapping | None = None) -> KernelConfig:
        """The config a file's entry (or a config) names; `launch`: the num_warps and num_stages to state where
        the entry leaves them out (what Triton launches with), else they stay left out."""
        if isinstance(entry, KernelConfig) and not launch:
            return entry
        full = {**launch, **entry} if launch else entry
        for k in LAUNCH:            # what Triton's launch takes: an integer, or the key left out
            if k in full and type(full[k]) is not int:
                raise ValueError(f"a config's {k} must be an integer, got {full[k]!r:.30}")
        # Made here in one pass (the search makes thousands a second): the fields and the entry they read as
        frozen = {k: _freeze(v) for k, v in canonical(full).items()}
        out = object.__new__(cls)
        object.__setattr__(out, "params", tuple((k, v) for k, v in frozen.items() if k not in LAUNCH))
        object.__setattr__(out, "num_warps", full.get("num_warps"))
        object.__setattr__(out, "num_stages", full.get("num_stages"))
        object.__setattr__(out, "_entry", {k: _thaw(v) for k, v in frozen.items()})
        return out

    def to_entry(self) -> dict:
        """The entry a file holds: every meta-parameter and the launch values it states, in the files' key
        order (a new dict: the caller's to keep or change)."""
        return {k: _thaw(_freeze(v)) for k, v in self._entry.items()}

    def launched(self, launch: Mapping) -> KernelConfig:
        """This config stating num_warps and num_stages: its own, else `launch`'s (what the launcher uses)."""
        return KernelConfig.from_entry(self._entry, launch)

    @cached_property
    def key(self) -> str:
        """The config as compact JSON in canonical order: its identity in caches and studies (what the
        records of every release are keyed by)."""
        c = self._entry
        # Triton configs (int and bool values, identifier keys) are most of every cache: written here
        # exactly as json.dumps writes them, in a fraction of its time (replays key 30k+ records).
        if all(type(v) is int or type(v) is bool for v in c.values()) and all(k.isidentifier() and k.isascii() for k in c):
            return "{" + ",".join(f'"{k}":{_JSON_BOOL[v] if type(v) is bool else v}' for k, v in c.items()) + "}"
        return json.dumps(c, separators=(",", ":"))

    def with_params(self, **params) -> KernelConfig:
        """This config with some meta-parameters changed (a second GEMM sharing a tile size with its first)."""
        return KernelConfig.from_entry({**self._entry, **params})

    # -- read as a mapping ---------------------------------------------------------------------------------
    def __getitem__(self, name: str):
        return self._entry[name]

    def __iter__(self):
        return iter(self._entry)

    def __len__(self) -> int:
        return len(self._entry)

    def __contains__(self, name) -> bool:
        return name in self._entry

    def __repr__(self) -> str:
        return f"KernelConfig({self.key})"

    # A dataclass's own eq and hash (Mapping's eq would make a dict equal to a config, and a config unhashable):
    # a config equals only a config.
    def __eq__(self, other):
        if not isinstance(other, KernelConfig):
            return NotImplemented
        return (self.params, self.num_warps, self.num_stages) == (other.params, other.num_warps, other.num_stages)

    def __hash__(self):
        return hash((self.params, self.num_warps, self.num_stages))

    def __reduce__(self):           # across a process's pipe: its entry, made into the value again
        return (KernelConfig.from_entry, (self.to_entry(),))


_JSON_BOOL = {True: "true", False: "false"}


def config_key(config: Mapping) -> str:
    """A config's identity in caches and studies (KernelConfig.key; a file's entry read as one)."""
    return (config if isinstance(config, KernelConfig) else KernelConfig.from_entry(config)).key
