"""A kernel config is one value (autotune.contract.config.KernelConfig), as Triton's Config is: frozen, with
num_warps and num_stages always, read from and written to SGLang's JSON entry in its files' key order."""
from __future__ import annotations

import dataclasses

import pytest

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


def test_a_config_always_carries_num_warps_and_num_stages():
    """SGLang's own configs leave them to Triton: read with Triton's launch values they state them, and are the
    value of the entry that names those values; without launch values to fill in, such an entry is refused."""
    sglangs = {k: v for k, v in ENTRY.items() if k not in LAUNCH}
    assert KernelConfig.from_entry(sglangs, LAUNCH) == KernelConfig.from_entry(ENTRY)
    assert KernelConfig.from_entry(sglangs, LAUNCH).to_entry() == ENTRY
    assert KernelConfig.from_entry({**ENTRY, "num_stages": 2}, LAUNCH).num_stages == 2     # the entry's own first
    with pytest.raises(ValueError, match="num_warps and no num_stages"):
        KernelConfig.from_entry(sglangs)


def test_a_config_is_a_frozen_value_a_switch_off_the_same_as_none():
    c = KernelConfig.from_entry(ENTRY)
    assert KernelConfig.from_entry({**ENTRY, "USE_TMA": False}) == c and "USE_TMA" not in c.to_entry()
    assert len({c, KernelConfig.from_entry(dict(reversed(list(ENTRY.items()))))}) == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.num_warps = 8
    assert c.with_params(BLOCK_SIZE_M=64)["BLOCK_SIZE_M"] == 64 and c["BLOCK_SIZE_M"] == 16
