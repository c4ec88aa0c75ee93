"""The library call behind `autotune run` (autotune.api): a typed request whose fields are the
command's flags, the run's outcome returned rather than kept on the command line's namespace."""
import dataclasses
import json

import pytest

from autotune import api
from autotune.cli import build_parser
from autotune.errors import UsageError
from tests.conftest import GRID

COMMANDS = {"run": (api.RunRequest, []), "worker": (api.WorkerRequest, ["--storage", "sqlite:///x.db"]),
            "export": (api.ExportRequest, []), "record": (api.RecordRequest, ["--cache", "c.jsonl.gz"])}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_flag_of_a_command_is_a_field_of_its_request_with_the_same_default(command):
    """A flag the request lacks would never reach the library; a default that differs would make a
    library call tune something else than the bare command does."""
    cls, required = COMMANDS[command]
    parsed = vars(build_parser().parse_args([command, *required]))
    fields = {f.name: f for f in dataclasses.fields(cls)}
    assert set(parsed) - {"fn", "cmd", "force"} <= set(fields), command
    given = {a.lstrip("-").replace("-", "_") for a in required[::2]}
    for name, value in parsed.items():
        if name in fields and name not in given:
            assert fields[name].default == value, (command, name)


def test_run_returns_what_it_did_and_writes_the_same_summary_as_json(tmp_path, capsys):
    req = api.RunRequest(model="qwen3.5-397b-a17b", tp=(8,), dtype="bf16", batch_sizes=(1, 8), replay=str(GRID),
                         trials=4, quiet=True, kernels="triton_moe", out=str(tmp_path / "out"),
                         storage=f"sqlite:///{tmp_path / 'a.db'}", json=str(tmp_path / "s.json"))
    result = api.run(req)
    assert result.out == str(tmp_path / "out/NVIDIA_H200")
    (problem,) = result.summary["triton_moe"]
    assert [r["M"] for r in problem["per_M"]] == [1, 8] and problem["files"]
    written = json.loads((tmp_path / "s.json").read_text())
    assert written["triton_moe"] == json.loads(json.dumps(result.summary["triton_moe"]))
    assert req.out == str(tmp_path / "out") and not hasattr(req, "_summary")   # the request is not run state
    # a second call starts its own summary: nothing is carried from one run to the next
    again = api.run(dataclasses.replace(req, json=None))
    assert len(again.summary["triton_moe"]) == 1 and again.summary["triton_moe"][0]["measured_this_run"] == 0


def test_bad_input_is_a_usage_error_of_the_library(tmp_path):
    with pytest.raises(UsageError, match="both name the device"):
        api.run(api.RunRequest(target_device="NVIDIA H200", replay=str(GRID), dry_run=True))
    with pytest.raises(UsageError, match="unknown kernel family 'nope'"):
        api.run(api.RunRequest(kernels="nope", out=str(tmp_path / "out")))
    assert not (tmp_path / "out").exists()
