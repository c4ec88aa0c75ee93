"""A kernel config is one value (autotune.contract.config.KernelConfig), as Triton's Config is: frozen, with
num_warps and num_stages always, read from and written to SGLang's JSON entry in its files' key order."""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autotune.contract.config import KernelConfig
from autotune.families.triton_moe.schema import CONFIG_ORDER

ENTRY = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4,
         "num_stages": 3}
LAUNCH = {"num_warps": 4, "num_stages": 3}


def test_an_entry_read_and_written_again_is_the_same_entry_in_the_files_key_order():
    shuffled = dict(reversed(list({**ENTRY, "USE_TMA": True}.items())))
    c = KernelConfig.from_entry(shuffled)
    assert (c.num_warps, c.num_stages, c["BLOCK_SIZE_N"], c["num_warps"]) == (4, 3, 64, 4)
    assert list(c.to_entry()) == list(CONFIG_ORDER) and c.to_entry() == {**ENTRY, "USE_TMA": True}
    assert KernelConfig.from_entry(c.to_entry()) == c


def test_a_config_carries_num_warps_and_num_stages_as_fields_and_states_them_once_launched():
    """SGLang's own configs leave them to Triton: such a config says so (None), stays the record it was measured
    as (its own key), and `launched` with Triton's launch values states both, the entry's own first."""
    sglangs = {k: v for k, v in ENTRY.items() if k not in LAUNCH}
    left = KernelConfig.from_entry(sglangs)
    assert (left.num_warps, left.num_stages) == (None, None) and "num_warps" not in left.to_entry()
    assert left != KernelConfig.from_entry(ENTRY) and left.key != KernelConfig.from_entry(ENTRY).key
    assert left.launched(LAUNCH) == KernelConfig.from_entry(sglangs, LAUNCH) == KernelConfig.from_entry(ENTRY)
    assert left.launched(LAUNCH).to_entry() == ENTRY
    assert KernelConfig.from_entry({**ENTRY, "num_stages": 2}).launched(LAUNCH).num_stages == 2   # the entry's own first


def test_a_config_is_a_frozen_value_a_switch_off_the_same_as_none():
    c = KernelConfig.from_entry(ENTRY)
    assert KernelConfig.from_entry({**ENTRY, "USE_TMA": False}) == c and "USE_TMA" not in c.to_entry()
    assert len({c, KernelConfig.from_entry(dict(reversed(list(ENTRY.items()))))}) == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.num_warps = 8
    assert c.with_params(BLOCK_SIZE_M=64)["BLOCK_SIZE_M"] == 64 and c["BLOCK_SIZE_M"] == 16


def test_a_config_equals_only_a_config_and_reads_as_its_entry():
    c = KernelConfig.from_entry(ENTRY)
    assert c != ENTRY and ENTRY != c          # a dict is a file's entry, never taken for the value
    assert dict(c) == ENTRY and {**c} == ENTRY and c.get("USE_TMA") is None and "BLOCK_SIZE_K" in c
    entry = c.to_entry()
    entry["BLOCK_SIZE_M"] = 999                 # the caller's copy: the value stays
    assert c["BLOCK_SIZE_M"] == 16


JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.text(max_size=5),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner,
                                                                                         max_size=2), max_leaves=6)
ENTRIES = st.dictionaries(st.sampled_from(["BLOCK_SIZE_M", "BLOCK_SIZE_N", "GROUP_SIZE_M", "USE_TMA", "backend",
                                           "tactic", "alpha", "zeta", "ü"]), JSON_VALUES, max_size=7).flatmap(
    lambda e: st.fixed_dictionaries({}, optional={k: st.integers(1, 64) for k in LAUNCH}).map(lambda l: {**e, **l}))


@settings(max_examples=300, deadline=None)
@given(ENTRIES)
def test_any_entry_reads_and_writes_back_as_its_canonical_form_and_its_key_is_that_json(entry):
    """Whatever a recording or a study holds for a config (Triton's tiles, a backend's compound tactic, keys no
    family declares): read as a value and written again it is the canonical entry, its key that entry's compact
    JSON (the identity every earlier cache and study was written with), and it survives a process's pipe."""
    import json
    import pickle

    from autotune.contract.config import canonical

    c = KernelConfig.from_entry(entry)
    assert c.to_entry() == canonical(entry) and list(c.to_entry()) == list(canonical(entry))
    assert c.key == json.dumps(canonical(entry), separators=(",", ":"))
    again = pickle.loads(pickle.dumps(c))
    assert again == c and hash(again) == hash(c) and again.key == c.key
    assert KernelConfig.from_entry(json.loads(json.dumps(c.to_entry()))) == c


@settings(max_examples=200, deadline=None)
@given(ENTRIES, ENTRIES)
def test_two_configs_are_one_value_exactly_when_their_keys_are_one(a, b):
    ca, cb = KernelConfig.from_entry(a), KernelConfig.from_entry(b)
    assert (ca == cb) == (ca.key == cb.key) or _bool_int_alias(ca, cb)


def _bool_int_alias(a, b) -> bool:
    """Python's True == 1 (a value may equal another whose JSON says true where the other says 1)."""
    return a.key.replace("true", "1").replace("false", "0") == b.key.replace("true", "1").replace("false", "0")


def test_a_measurement_holds_a_config_value_and_its_record_a_json_object():
    from autotune.measure.records import OK, Measurement

    m = Measurement("p", "down", 1, KernelConfig.from_entry(ENTRY), OK, time_us=2.0)
    d = m.to_dict()
    assert d["config"] == ENTRY and Measurement.from_dict(d) == m
    with pytest.raises(ValueError, match="config must be a JSON object"):
        Measurement.from_dict({**d, "config": [1, 2]})
    with pytest.raises(ValueError, match="not a measurement record"):
        Measurement("p", "down", 1, dict(ENTRY), OK, time_us=2.0)


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(sorted(LAUNCH)), JSON_VALUES.filter(lambda v: type(v) is not int))
def test_a_launch_value_that_is_not_an_integer_is_refused_in_one_line(key, value):
    with pytest.raises(ValueError, match=f"config's {key} must be an integer"):
        KernelConfig.from_entry({**ENTRY, key: value})


def test_the_core_holds_configs_as_values_and_refuses_a_dict_where_a_file_is_not_read():
    """A task, a measurement, a finalist's choice: each holds KernelConfig values, and a dict handed to one is
    refused where it is made (a dict is a file's entry: KernelConfig.from_entry reads it)."""
    import re
    from pathlib import Path

    from autotune.measure.tasks import Task
    from autotune.search.finalists import Choice

    c = KernelConfig.from_entry(ENTRY)
    for make in (lambda cfg: Task({}, "p", "down", cfg, [1]), lambda cfg: Task({}, "p", "down", c, [1], versus=cfg),
                 lambda cfg: Choice.pair(1, (c, cfg), (1.0, 1.0)), lambda cfg: Choice.layer(1, cfg, 1.0, None)):
        make(c)
        with pytest.raises(TypeError, match="KernelConfig"):
            make(dict(ENTRY))
    # and no signature of the core or of a family takes one as a dict
    root = Path(__file__).resolve().parents[2] / "autotune"
    typed = re.compile(r"\b(config|cfg|versus)\s*:\s*dict\b")
    found = [f"{p.relative_to(root)}:{i}" for p in root.rglob("*.py")
             for i, line in enumerate(p.read_text().splitlines(), 1) if typed.search(line)]
    assert found == []
