"""Tuned folders as `run` and `validate --gate` leave them, serving git repos, and the state a test compares."""
import hashlib
import json
import subprocess
from pathlib import Path

from autotune.contract.config import KernelConfig
from autotune.gpus.device import DeviceInfo
from autotune.families.triton_moe.export import export_problem
from autotune.folder.tuned import TunedFolder
from autotune.problems.models import Problem
from autotune.search.finalists import Choice

DEV = DeviceInfo("NVIDIA RTX PRO 6000 Blackwell Server Edition", 120, 101376,
                 versions={"triton": "3.6.0", "sglang": "0.5.23", "torch": "2.11.0"})
P = Problem(512, 128, 4096, 10, "bf16", batch_sizes=(1, 64))
A = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4, "num_stages": 3}
UP = "E=512,N=128,device_name=NVIDIA_RTX_PRO_6000_Blackwell_Server_Edition.json"


def git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def tuned(tmp_path, name, times, cfg=A, gate=True, device=DEV):
    out = tmp_path / name
    choices = {M: Choice.pair(M, (KernelConfig.from_entry(cfg),) * 2, (t / 2, t / 2), "tuned", {"default": 2 * t, "shipped": None}) for M, t in times.items()}
    export_problem(TunedFolder.under(out, device), P, choices, {})
    if gate is not None:
        validated(out / device.file_name, gate)
    return out / device.file_name


def validated(folder, gate=True, validated_on="gpu"):
    """The record `autotune validate --gate` writes: its gate (autotune.validate.gate.GateResult.to_dict)
    and what it judged (autotune.validate.judged: the folder's files as they are now)."""
    from autotune.validate.judged import snapshot

    lines = (["gate passed: tuned is not slower than baseline beyond noise at any of 6 tested points"] if gate
             else ["regression at bs 64: tuned 900.0 tok/s vs baseline 950.0 tok/s", "gate FAILED"])
    path = folder / "validation.json"
    record = json.loads(path.read_text()) if path.exists() else {}      # a copied record keeps its other keys
    record.update(gate={"passed": gate, "allow_regression": False, "regressions": [] if gate else ["bs 64"],
                        "lines": lines},
                  judged={**snapshot(folder), "validated_on": validated_on})
    path.write_text(json.dumps(record))
    return folder


def serving_repo(t):
    import subprocess
    repo = t / "serving"
    repo.mkdir()
    (repo / "README").write_text("deploy repo\n")
    for cmd in (["init", "-q", "-b", "main"], ["add", "README"],
                ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "init"]):
        subprocess.run(["git", "-C", str(repo), *cmd], check=True, capture_output=True)
    return repo


def file_hashes(root: Path) -> dict:
    return {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()}


def git_state(repo: Path) -> tuple:
    """What a refused publish must leave as it was: the branch (or commit) checked out, every branch,
    the index and working tree (new files, ignored ones too), and every file's content."""
    import subprocess

    def git(*args):
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True).stdout
    return (git("symbolic-ref", "-q", "HEAD"), git("rev-parse", "HEAD"), git("branch", "--list", "-v"),
            git("status", "--porcelain", "--ignored", "--untracked-files=all"),
            {p: h for p, h in file_hashes(repo).items() if ".git" not in p.relative_to(repo).parts})
