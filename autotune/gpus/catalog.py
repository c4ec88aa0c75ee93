"""The one GPU catalog: each GPU model autotune knows, by the name torch.cuda.get_device_name() gives it.

A row holds what planning needs without the GPU at hand: the compute capability (which search-space
section, which backends), the shared memory a block may opt into (which tiles compile), the GPU's
memory (how many measuring workers fit), its SM count and memory bandwidth (for reading reports), and
its product line (SKUs of one line share tuned files under each other's names: export.skus).

Memory is what `nvidia-smi` reports as the total where a card was seen (the H100 and H200 lent to this
project), else the vendor's datasheet capacity; bandwidths are datasheet figures. A live GPU is always
read from the driver: the catalog is for planning (`run --dry-run --target-device`, `shapes
--target-sm`) and for the names of SKUs.
"""
from __future__ import annotations

from dataclasses import dataclass

# The most GPUs one SGLang server spans that a flag or a file of ours may name (ranks, --tp x --pp).
MAX_GPUS = 1024

MiB = 1 << 20
GiB = 1 << 30

# Architecture families by compute capability (SM103 runs SM100 code, SM121 SM120's).
SM100S = frozenset({100, 103})
SM120S = frozenset({120, 121})

# Opt-in shared memory per block (bytes) of each compute capability, for planning by architecture.
SMEM_OPTIN = {80: 166912, 86: 101376, 89: 101376, 90: 232448, 100: 232448, 103: 232448,
              110: 232448, 120: 101376, 121: 101376}


def arch_section(sm: int) -> str:
    """Search-space section for a compute capability: SM103 runs SM100 code, SM121 SM120's."""
    if sm >= 120:
        return "sm120"
    if sm >= 100:
        return "sm100"
    return "sm90" if sm >= 90 else f"sm{sm}"


@dataclass(frozen=True)
class Gpu:
    name: str              # torch.cuda.get_device_name()
    product: str           # SKUs of one product line share tuned files (export.skus)
    sm: int                # compute capability major*10+minor
    memory_mib: int        # total GPU memory
    num_sms: int
    bandwidth_gbs: int     # memory bandwidth, datasheet

    @property
    def smem_optin(self) -> int:
        return SMEM_OPTIN[self.sm]

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * MiB

    @property
    def arch(self) -> str:
        return arch_section(self.sm)


CATALOG = (
    Gpu("NVIDIA H100 80GB HBM3", "H100", 90, 81559, 132, 3350),      # memory as seen on the lent H100s
    Gpu("NVIDIA H100 PCIe", "H100", 90, 81559, 114, 2000),
    Gpu("NVIDIA H100 NVL", "H100", 90, 95830, 132, 3900),
    Gpu("NVIDIA H200", "H200", 90, 143771, 132, 4800),                # memory as seen on the lent H200s
    Gpu("NVIDIA H200 NVL", "H200", 90, 143771, 132, 4800),
    Gpu("NVIDIA B200", "B200", 100, 183359, 148, 8000),
    Gpu("NVIDIA RTX PRO 6000 Blackwell Server Edition", "RTX PRO 6000 Blackwell", 120, 97887, 188, 1792),
    Gpu("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "RTX PRO 6000 Blackwell", 120, 97887, 188, 1792),
    Gpu("NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", "RTX PRO 6000 Blackwell", 120, 97887, 188, 1792),
    Gpu("NVIDIA GeForce RTX 5090", "RTX 5090", 120, 32607, 170, 1792),
)
BY_NAME = {g.name: g for g in CATALOG}
# The GPU a plan by architecture alone (`--target-sm N`) is reported as.
BY_SM = {90: BY_NAME["NVIDIA H200"], 100: BY_NAME["NVIDIA B200"],
         120: BY_NAME["NVIDIA RTX PRO 6000 Blackwell Server Edition"]}


def find(name: str) -> Gpu | None:
    return BY_NAME.get(name.strip())


def same_product(a: str, b: str) -> bool | None:
    """True/False where the catalog knows either name (both in one product line or not), None where
    it knows neither: new SKUs appear before any table knows them."""
    ga, gb = find(a), find(b)
    if ga is None and gb is None:
        return None
    return ga is not None and gb is not None and ga.product == gb.product
