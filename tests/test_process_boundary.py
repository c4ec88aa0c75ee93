"""The edges no schema reaches (issue 44, part A): the process's environment, publish's git steps, a
serving repo another publish holds. Each case: one line, the exit code, and the serving repo (its refs,
HEAD, branch list, index and files) and every other repository exactly as found.

Run in-process (`autotune.cli.main`) on tiny repositories: what reaches git is autotune.programs'
environment, whatever this process's holds."""
import subprocess
from pathlib import Path

import pytest

from autotune.cli import main
from tests.fakes.tuned_folders import DEV, file_hashes, git_state, serving_repo, tuned


def _one_line(capsys, rc, code, says) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == code and len(err) == 1 and err[0].startswith("autotune: error: ") and says in err[0], (rc, err)
    assert "Traceback" not in err[0]
    return err[0]


def _publish(repo, src, *extra) -> list:
    return ["publish", "--to", str(repo), "--from", str(src), *extra]


def _hook(repo: Path, name: str, body: str) -> None:
    hook = repo / ".git/hooks" / name
    hook.write_text("#!/bin/sh\n" + body)
    hook.chmod(0o755)


# --- git reads no variable of the shell's -------------------------------------------------------------

@pytest.mark.parametrize("var", ["GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"])
def test_publish_goes_into_the_serving_repo_whatever_git_variables_the_shell_holds(tmp_path, capsys, monkeypatch,
                                                                                     var):
    """GIT_DIR naming another repository: the branch and commit went there (its HEAD switched), exit 0;
    a GIT_INDEX_FILE a hook set: a false "uncommitted changes"."""
    (tmp_path / "elsewhere").mkdir()
    other = serving_repo(tmp_path / "elsewhere")
    other_state = git_state(other)
    repo = serving_repo(tmp_path)
    src = tuned(tmp_path, "a", {1: 10.0})
    monkeypatch.setenv(var, {"GIT_DIR": str(other / ".git"), "GIT_WORK_TREE": str(other),
                             "GIT_INDEX_FILE": str(other / ".git/index")}[var])
    assert main(_publish(repo, src)) == 0, capsys.readouterr().err
    monkeypatch.delenv(var)
    assert git_state(other) == other_state
    head = subprocess.run(["git", "-C", str(repo), "symbolic-ref", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    assert head == f"tuned/{DEV.file_name}"


def test_no_git_on_path_is_one_line_naming_it(tmp_path, capsys, monkeypatch):
    repo = serving_repo(tmp_path)
    src = tuned(tmp_path, "a", {1: 10.0})
    state, before = git_state(repo), file_hashes(tmp_path)
    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    rc = main(_publish(repo, src))
    monkeypatch.undo()
    _one_line(capsys, rc, 2, f"git is not on PATH ({tmp_path / 'bin'})")
    assert git_state(repo) == state and file_hashes(tmp_path) == before


def test_a_failing_git_is_named_by_its_path(tmp_path, capsys):
    repo = serving_repo(tmp_path)
    _hook(repo, "pre-commit", "echo 'no commits today' >&2\nexit 1\n")
    state = git_state(repo)
    rc = main(_publish(repo, tuned(tmp_path, "a", {1: 10.0})))
    line = _one_line(capsys, rc, 2, f"git commit failed in {repo} (")
    assert line.endswith("): no commits today") and "/git)" in line
    assert git_state(repo) == state


# --- credentials and litter ------------------------------------------------------------------------------

def test_a_token_in_the_serving_url_is_never_printed_and_the_failed_clone_leaves_nothing(tmp_path, capsys,
                                                                                        monkeypatch):
    import tempfile

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    src = tuned(tmp_path, "a", {1: 10.0})
    rc = main(_publish("https://deploy:s3cretTOKEN@127.0.0.1:1/serving.git", src))
    line = _one_line(capsys, rc, 2, "cannot clone https://deploy:***@127.0.0.1:1/serving.git (")
    assert "s3cret" not in line and "TOKEN" not in line
    assert list(scratch.iterdir()) == []                 # no autotune-publish-XXXX left behind


@pytest.mark.parametrize("text,shown", [
    ("fatal: unable to access 'https://u:tok@h/r.git/': refused", "fatal: unable to access 'https://u:***@h/r.git/': refused"),
    ("https://ghp_abc123@github.com/o/r.git", "https://***@github.com/o/r.git"),
    ("https://0123456789abcdef0123456789@host/r.git", "https://***@host/r.git"),
    ("ssh://git@host/r.git and postgresql://bob@db/x", "ssh://git@host/r.git and postgresql://bob@db/x"),
    ("postgresql://bob:pa@ss@db:5432/x and sqlite:///a.db", "postgresql://bob:***@db:5432/x and sqlite:///a.db"),
    ("git@github.com:o/r.git", "git@github.com:o/r.git")])
def test_what_a_program_prints_has_its_urls_credentials_masked(tmp_path, text, shown):
    from autotune import programs
    from autotune.errors import one_line

    echo = programs.run(["sh", "-c", 'printf "%s" "$0" >&2', text])
    assert echo.stderr == shown and one_line(text) == shown


# --- publish's steps undone, whatever fails ------------------------------------------------------------------

def test_a_post_checkout_hook_that_fails_leaves_the_repo_as_found(tmp_path, capsys):
    """The hook ran after `checkout -b` had made and checked out the branch: publish exited 2 with the
    repo on the new branch, and the next publish said the branch existed."""
    repo = serving_repo(tmp_path)
    _hook(repo, "post-checkout", "echo 'post-checkout: refused' >&2\nexit 1\n")
    src = tuned(tmp_path, "a", {1: 10.0})
    state = git_state(repo)
    _one_line(capsys, main(_publish(repo, src)), 2, "git checkout failed in")
    assert git_state(repo) == state
    (repo / ".git/hooks/post-checkout").unlink()
    assert main(_publish(repo, src)) == 0, capsys.readouterr().err


def test_a_path_into_the_git_folder_is_refused_saying_so(tmp_path, capsys):
    repo = serving_repo(tmp_path)
    state = git_state(repo)
    rc = main(_publish(repo, tuned(tmp_path, "a", {1: 10.0}), "--path", ".git/tuned"))
    _one_line(capsys, rc, 2, "--path .git/tuned is inside the serving repo's .git folder")
    assert git_state(repo) == state and not (repo / ".git/tuned").exists()


def test_a_second_publish_while_one_holds_the_repo_is_told_so(tmp_path, capsys):
    """The loser of two concurrent publishes said "...json is not a file autotune wrote" (it met the
    winner's half-written files)."""
    from autotune.publish.serving_repo import held

    repo = serving_repo(tmp_path)
    src = tuned(tmp_path, "a", {1: 10.0})
    state = git_state(repo)
    with held(repo):
        rc = main(_publish(repo, src))
        _one_line(capsys, rc, 2, f"another autotune publish holds {repo}")
        assert git_state(repo) == state
    assert main(_publish(repo, src)) == 0, capsys.readouterr().err     # and the lock went with its holder


def test_every_external_program_starts_through_the_one_door():
    """autotune/programs.py is the only module that starts a program (its environment, lookup and masking
    hold for all): a subprocess call anywhere else is a program started around them."""
    import re

    from tests.conftest import ROOT

    starts = re.compile(r"\bsubprocess\.(run|Popen|call|check_call|check_output)\(|\bos\.(system|exec\w*|spawn\w*)\(")
    found = [f"{p.relative_to(ROOT)}:{n}" for p in sorted((ROOT / "autotune").rglob("*.py"))
             if p.name != "programs.py" or p.parent.name != "autotune"
             for n, line in enumerate(p.read_text().splitlines(), 1) if starts.search(line)]
    assert found == []
