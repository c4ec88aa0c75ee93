"""`autotune check` on the serving machine: a changed Triton, a changed GPU and a fresh folder."""
import json
from pathlib import Path

import pytest

from autotune import device as devmod
from autotune.cli import main

FOLDER = Path(__file__).resolve().parent.parent / "tuned_configs/NVIDIA_H200"


def machine_as_measured(**change):
    d = json.loads((FOLDER / "provenance.json").read_text())["device"]
    versions = {**d["versions"], **change.pop("versions", {})}
    return devmod.DeviceInfo.from_dict({**d, **change, "versions": versions})


@pytest.mark.parametrize("change,code,says", [
    ({}, 0, "GPU NVIDIA H200 and Triton 3.6.0 as measured"),
    ({"versions": {"triton": "3.8.0"}}, 1, "Triton: measured with 3.6.0, this machine has 3.8.0"),
    ({"name": "NVIDIA H100 80GB HBM3"}, 1, "will not load these files here"),
    ({"versions": {"torch": "2.14.1"}, "driver": "590.1"}, 0, "note: torch: measured with 2.11.0+cu130"),
])
def test_machine_drift(monkeypatch, capsys, change, code, says):
    monkeypatch.setattr(devmod, "detect", lambda *a, **k: machine_as_measured(**change))
    assert main(["check", str(FOLDER), "--sglang-version", "0.5.23"]) == code
    assert says in capsys.readouterr().out


def test_without_a_gpu_only_sglang_is_checked_and_it_says_so(monkeypatch, capsys):
    def none(*a, **k):
        raise devmod.NoDeviceError("no CUDA GPU visible")
    monkeypatch.setattr(devmod, "detect", none)
    assert main(["check", str(FOLDER), "--sglang-version", "0.5.23"]) == 0
    assert "no GPU visible here" in capsys.readouterr().out
