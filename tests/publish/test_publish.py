"""`autotune publish` against real git repositories: the happy path and the three refusals."""
import json
import subprocess

import pytest

from autotune.cli import main
from autotune.folder.tuned import TunedFolder
from tests.fakes.tuned_folders import A, DEV, UP, git, tuned, validated

B = {**A, "BLOCK_SIZE_N": 128}


@pytest.fixture
def serving(tmp_path):
    repo = tmp_path / "serving"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "README").write_text("deploy repo\n")
    git(repo, "add", "README")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "init")
    return repo


def test_happy_path_one_commit_on_a_new_branch(tmp_path, serving, capsys):
    src = tuned(tmp_path, "a", {1: 10.0, 64: 100.0})
    assert main(["publish", "--to", str(serving), "--from", str(src)]) == 0
    branch = f"tuned/{DEV.file_name}"
    assert git(serving, "rev-parse", "--abbrev-ref", "HEAD") == branch
    assert git(serving, "rev-list", "--count", f"main..{branch}") == "1"
    msg = git(serving, "log", "-1", "--format=%B")
    assert "RTX PRO 6000" in msg and "triton 3.6.0" in msg and "gate passed" in msg and "2.000x" in msg
    got = json.loads((serving / f"tuned_configs/{DEV.file_name}/configs/triton_3_6_0/{UP}").read_text())
    assert got == {"1": A, "64": A}
    assert git(serving, "status", "--porcelain") == ""


@pytest.mark.parametrize("reach", ["copied", "dot", "dotdot"])
def test_the_folder_and_branch_are_named_by_the_device_however_the_folder_is_reached(tmp_path, serving, capsys,
                                                                                    monkeypatch, reach):
    """A copy at /tmp/src went to tuned_configs/src on tuned/src; `--from .` made the branch 'tuned/'."""
    import shutil

    src = tmp_path / "src"
    shutil.copytree(tuned(tmp_path, "a", {1: 10.0, 64: 100.0}), src)
    given = {"copied": str(src), "dot": ".", "dotdot": str(src / "configs" / "..")}[reach]
    monkeypatch.chdir(src)
    assert main(["publish", "--to", str(serving), "--from", given]) == 0, capsys.readouterr().err
    assert git(serving, "rev-parse", "--abbrev-ref", "HEAD") == f"tuned/{DEV.file_name}"
    assert (serving / f"tuned_configs/{DEV.file_name}/configs/triton_3_6_0/{UP}").is_file()


def test_refuses_without_or_with_failed_validation(tmp_path, serving, capsys):
    assert main(["publish", "--to", str(serving), "--from", str(tuned(tmp_path, "a", {1: 10.0}, gate=None))]) == 2
    assert "validation.json is missing" in capsys.readouterr().err
    assert main(["publish", "--to", str(serving), "--from", str(tuned(tmp_path, "b", {1: 10.0}, gate=False))]) == 2
    err = capsys.readouterr().err
    assert "validation failed" in err and "tuned 900.0 tok/s vs baseline 950.0" in err
    assert git(serving, "rev-parse", "--abbrev-ref", "HEAD") == "main"   # nothing touched


def test_refuses_a_dirty_serving_tree(tmp_path, serving, capsys):
    (serving / "README").write_text("local edit\n")
    assert main(["publish", "--to", str(serving), "--from", str(tuned(tmp_path, "a", {1: 10.0}))]) == 2
    assert "uncommitted changes" in capsys.readouterr().err


def test_keeps_the_serving_repos_faster_entries_per_M_and_refuses_when_all_are_faster(tmp_path, serving, capsys):
    first = tuned(tmp_path, "first", {1: 10.0, 64: 100.0}, cfg=A)
    assert main(["publish", "--to", str(serving), "--from", str(first), "--branch", "t1"]) == 0
    git(serving, "checkout", "-q", "main")
    git(serving, "merge", "-q", "t1")
    # ours: faster at M=64, slower at M=1 -> M=1 stays the serving repo's, and the message says so
    second = tuned(tmp_path, "second", {1: 12.0, 64: 80.0}, cfg=B)
    assert main(["publish", "--to", str(serving), "--from", str(second), "--branch", "t2"]) == 0
    out = capsys.readouterr().out
    assert "M=1: serving repo's 10.00 us beats ours 12.00 us" in out
    got = json.loads((serving / f"tuned_configs/{DEV.file_name}/configs/triton_3_6_0/{UP}").read_text())
    assert got == {"1": A, "64": B}
    assert "kept from the serving repo" in git(serving, "log", "-1", "--format=%B")
    git(serving, "checkout", "-q", "main")
    git(serving, "merge", "-q", "t2")
    # slower everywhere: nothing to publish
    third = tuned(tmp_path, "third", {1: 20.0, 64: 200.0}, cfg=A)
    assert main(["publish", "--to", str(serving), "--from", str(third), "--branch", "t3"]) == 2
    assert "nothing to publish" in capsys.readouterr().err
    assert git(serving, "branch", "--list", "t3") == ""


def test_publishes_to_a_git_url_by_clone_and_push(tmp_path, serving):
    bare = tmp_path / "remote.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(serving), str(bare)], check=True)
    src = tuned(tmp_path, "a", {1: 10.0})
    assert main(["publish", "--to", f"file://{bare}", "--from", str(src)]) == 0
    assert git(bare, "branch", "--list", f"tuned/{DEV.file_name}").strip("* ") == f"tuned/{DEV.file_name}"


def test_publish_carries_the_shipped_overlay_and_keeps_a_tuned_file_first(tmp_path, serving):
    from autotune.families.triton_moe.overlay import overlay_shipped

    src = tuned(tmp_path, "ours", {1: 10.0, 64: 50.0})
    builtin = tmp_path / "sglang_builtin/configs/triton_3_6_0"
    builtin.mkdir(parents=True)
    other = "E=256,N=64,device_name=NVIDIA_RTX_PRO_6000_Blackwell_Server_Edition.json"
    (builtin / other).write_text(json.dumps({"1": A}))
    (builtin / UP).write_text(json.dumps({"1": B}))             # SGLang ships our tuned shape too
    rec = overlay_shipped(TunedFolder(src, DEV), ("0.5.23",), builtin=builtin.parent.parent, sglang_version="0.5.23")
    assert rec["files"] == [f"configs/triton_3_6_0/{other}"]
    validated(src)                   # the folder validated as it now is, with the overlay
    assert main(["publish", "--to", str(serving), "--from", str(src)]) == 0
    dest = serving / "tuned_configs" / DEV.file_name
    assert json.loads((dest / "configs/triton_3_6_0" / other).read_text()) == {"1": A}
    assert json.loads((dest / "configs/triton_3_6_0" / UP).read_text())["1"] == A      # ours, not the shipped B
    assert json.loads((dest / "provenance.json").read_text())["shipped_overlay"]["files"] == rec["files"]


def test_publish_merges_server_args_with_the_serving_repos_families(tmp_path, serving):
    """Two tuned folders, one with the MoE runner choices and one with the FP8 GEMM choice, published
    one after the other: the serving repo's server_args.yaml ends with both (merged, not replaced)."""
    import shutil
    from pathlib import Path

    from autotune.export import server_args

    committed = Path(__file__).resolve().parents[2] / "tuned_configs/NVIDIA_H200"
    folders = {}
    for name, keep in (("moe", ("moe_fp8", "moe_bf16")), ("gemm", ("fp8_gemm",))):
        f = tmp_path / name / "NVIDIA_H200"
        shutil.copytree(committed, f)
        d = json.loads((f / "backend_choice.json").read_text())
        d["families"] = {k: v for k, v in d["families"].items() if k in keep}
        (f / "backend_choice.json").write_text(json.dumps(d))
        folders[name] = f
    # the second folder also brings a faster M=1 entry, so it has configs to publish
    prov = json.loads((folders["gemm"] / "provenance.json").read_text())
    up = "E=512,N=128,device_name=NVIDIA_H200.json"
    prov["files"][up]["per_M"]["1"]["tuned_us"] /= 2
    (folders["gemm"] / "provenance.json").write_text(json.dumps(prov))
    cfg = folders["gemm"] / "configs/triton_3_6_0" / up
    c = json.loads(cfg.read_text())
    c["1"] = {**c["1"], "num_stages": 5 if c["1"]["num_stages"] != 5 else 4}
    cfg.write_text(json.dumps(c))
    for f in folders.values():
        validated(f)                 # each folder validated as it now is
    assert main(["publish", "--to", str(serving), "--from", str(folders["moe"]), "--branch", "b1"]) == 0
    values = server_args.read_values(serving / "tuned_configs/NVIDIA_H200/server_args.yaml")
    assert values.get("moe-runner-backend") == "triton" and "fp8-gemm-backend" not in values
    assert main(["publish", "--to", str(serving), "--from", str(folders["gemm"]), "--branch", "b2"]) == 0
    values = server_args.read_values(serving / "tuned_configs/NVIDIA_H200/server_args.yaml")
    assert values.get("moe-runner-backend") == "triton" and values.get("fp8-gemm-backend") == "triton"


# --- publish proves what it committed ----------------------------------------------------------------

def _state(repo):
    """What a user sees of a repo: its files (git's own store aside), its refs and what is checked out."""
    import hashlib

    files = {p.relative_to(repo).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
             for p in repo.rglob("*") if p.is_file() and ".git" not in p.relative_to(repo).parts}
    return files, git(repo, "for-each-ref", "--format=%(refname) %(objectname)"), \
        git(repo, "symbolic-ref", "HEAD"), git(repo, "status", "--porcelain")


def _commit_file(repo, name, text):
    (repo / name).write_text(text)
    git(repo, "add", name)
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", f"add {name}")


def _one_line(capsys, rc, says):
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and says in err[0], (rc, err)
    return err[0]


def test_a_serving_repo_that_ignores_json_is_refused_with_the_repo_unchanged(tmp_path, serving, capsys):
    """.gitignore holds *.json: publish said "published 80 files" where the commit held 3 (exit 0)."""
    _commit_file(serving, ".gitignore", "*.json\n")
    before = _state(serving)
    rc = main(["publish", "--to", str(serving), "--from", str(tuned(tmp_path, "a", {1: 10.0}))])
    line = _one_line(capsys, rc, "the serving repo ignores 4 of the 4 files to publish")
    assert ".gitignore:1: *.json" in line and f"configs/triton_3_6_0/{UP}" in line
    assert _state(serving) == before


@pytest.mark.parametrize("how", ["hook-drops-a-file", "hook-adds-a-file", "filter-changes-bytes"])
def test_a_commit_that_is_not_the_plan_is_refused_and_the_repo_put_back(tmp_path, serving, capsys, how):
    """What no check before the commit sees: a pre-commit hook that takes a file out of the index or adds
    one beyond the plan, a clean filter that rewrites the JSON. The committed tree is compared with the
    plan (git ls-tree, git diff-tree)."""
    src = tuned(tmp_path, "a", {1: 10.0})
    prov = f"tuned_configs/{DEV.file_name}/provenance.json"
    if how.startswith("hook"):
        hook = serving / ".git/hooks/pre-commit"
        hook.write_text(f"#!/bin/sh\ngit rm -q --cached -- '{prov}'\n" if how == "hook-drops-a-file" else
                        "#!/bin/sh\necho more > notes.txt && git add notes.txt\n")
        hook.chmod(0o755)
        says = (f"1 of the 4 planned files are not in it ({prov})" if how == "hook-drops-a-file" else
                "it also changes notes.txt, which publish did not plan")
    else:
        _commit_file(serving, ".gitattributes", "*.json filter=lower\n")
        git(serving, "config", "filter.lower.clean", "tr A-Z a-z")
        says = "hold other bytes than planned"
    before = _state(serving)
    rc = main(["publish", "--to", str(serving), "--from", str(src)])
    line = _one_line(capsys, rc, "the commit is not what publish planned: ")
    assert says in line and line.endswith("the serving repo is put back as it was")
    assert _state(serving) == before and git(serving, "branch", "--list") == "* main"



def test_the_serving_repos_entry_of_another_gpu_or_stack_is_never_kept_as_faster():
    """merge_file keeps a serving repo's entry per M only where it was timed faster on the same GPU and
    the same Triton, SGLang and torch: a time taken elsewhere says nothing of this GPU's."""
    from autotune.publish import merge_file

    def entry(device, us, **versions):
        return {"device": device, "versions": {"triton": "3.6.0", "sglang": "0.5.23", "torch": "2.11.0", **versions},
                "per_M": {"1": {"tuned_us": us}}}
    ours, faster = {"1": A}, {"1": B}
    mine = entry(DEV.name, 10.0)
    assert merge_file(ours, mine, faster, entry(DEV.name, 5.0)) == ({"1": B}, {"1": {"tuned_us": 5.0}},
                                                                   {"1": "serving repo's 5.00 us beats ours 10.00 us"})
    for theirs in (entry("NVIDIA H200", 5.0), entry(DEV.name, 5.0, triton="3.5.1"),
                   entry(DEV.name, 5.0, sglang="0.5.16"), entry(DEV.name, 5.0, torch="2.9.0")):
        assert merge_file(ours, mine, faster, theirs) == ({"1": A}, {"1": {"tuned_us": 10.0}}, {})


def test_the_count_said_is_the_files_committed(tmp_path, serving, capsys):
    assert main(["publish", "--to", str(serving), "--from", str(tuned(tmp_path, "a", {1: 10.0}))]) == 0
    said = int(capsys.readouterr().out.split(" files")[0].rsplit(" ", 1)[1])
    committed = git(serving, "diff-tree", "-r", "--name-only", "--no-commit-id", "HEAD").splitlines()
    assert said == len(committed) == 4 and f"tuned_configs/{DEV.file_name}/validation.json" in committed


def test_a_folder_changed_after_its_validation_is_refused(tmp_path, serving, capsys):
    """validation.json named no hashes: any passing one was accepted for whatever the folder held."""
    src = tuned(tmp_path, "a", {1: 10.0})
    cfg = src / "configs/triton_3_6_0" / UP
    cfg.write_text(json.dumps({"1": B}))                 # a hand edit after the gate
    (src / "notes.json").write_text("{}")                 # and a file the gate never saw
    before = _state(serving)
    line = _one_line(capsys, main(["publish", "--to", str(serving), "--from", str(src)]), "judged other bytes than")
    assert f"configs/triton_3_6_0/{UP} changed" in line and "notes.json not judged" in line
    assert _state(serving) == before


def test_a_validation_that_names_no_hashes_is_refused(tmp_path, serving, capsys):
    src = tuned(tmp_path, "a", {1: 10.0})
    record = json.loads((src / "validation.json").read_text())
    del record["judged"]                                    # as every validation.json was written before
    (src / "validation.json").write_text(json.dumps(record))
    _one_line(capsys, main(["publish", "--to", str(serving), "--from", str(src)]),
              "names no sha256 of the files it judged")


def test_a_cpu_interpreter_validation_is_refused(tmp_path, serving, capsys):
    src = validated(tuned(tmp_path, "a", {1: 10.0}), validated_on="cpu-interpreter")
    _one_line(capsys, main(["publish", "--to", str(serving), "--from", str(src)]),
              "was measured on cpu-interpreter, not a GPU")


def test_a_replay_folder_is_never_published_as_gpu_validated(tmp_path, serving, capsys):
    """A replay folder with a passing validation.json (the committed H200 one copied in) was published
    as "gate passed: 12 judged points"."""
    import shutil
    from dataclasses import replace
    from pathlib import Path

    replay = replace(DEV, kind="replay")
    src = tuned(tmp_path, "a", {1: 10.0}, device=replay)          # validated, hashes and all
    before = _state(serving)
    _one_line(capsys, main(["publish", "--to", str(serving), "--from", str(src)]),
              "configs were measured by replay, not on a GPU")
    shutil.copy(Path(__file__).resolve().parents[2] / "tuned_configs/NVIDIA_H200/validation.json", src)
    _one_line(capsys, main(["publish", "--to", str(serving), "--from", str(src)]),
              "configs were measured by replay, not on a GPU")
    assert _state(serving) == before


def test_every_committed_validated_folder_publishes_or_the_readme_says_why_not(tmp_path, capsys):
    """The README calls both committed folders validated: each publishes as it is, or the README says
    why publish refuses it (the 0.5.16 folder's configs were selected by a replay of the H200
    recordings: "measured by replay")."""
    import re

    from tests.conftest import ROOT

    readme = " ".join((ROOT / "README.md").read_text().split())
    outcomes = {}
    for record in sorted((ROOT / "tuned_configs").rglob("validation.json")):
        src = record.parent
        repo = tmp_path / f"serving{len(outcomes)}"
        repo.mkdir()
        git(repo, "init", "-q", "-b", "main")
        _commit_file(repo, "README", "deploy repo\n")
        rc = main(["publish", "--to", str(repo), "--from", str(src)])
        err = capsys.readouterr().err
        rel = src.relative_to(ROOT).as_posix()
        outcomes[rel] = rc
        if rc != 0:
            why = re.search(r"measured by (\w+)", err)
            assert rc == 2 and why, err
            assert f"`{rel}/`" in readme and f'refuses it as "measured by {why.group(1)}"' in readme, (rel, err)
    assert outcomes == {"tuned_configs/NVIDIA_H200": 0, "tuned_configs/sglang-0.5.16/NVIDIA_H200": 2}
