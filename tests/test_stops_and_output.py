"""What the process does around the command (issue 37): a stop at any moment is one line and exit 130
or 143, however early and however often; the terminal's encoding is never a reason to fail; an output
the file system cannot hold (a name too long, a full disk, an unwritable place) is refused before
anything is measured.

The stops are delivered where they hurt, deterministically: a finder on sys.meta_path (installed by a
sitecustomize of the test's own) sends the signal while a named module is being imported, from code
run from a string where the case needs one (as dataclasses build their methods)."""
import gzip
import hashlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.cli import main
from tests.conftest import GRID

SHAPES = ["shapes", "--model", "qwen3.5-397b-a17b", "--tp", "8"]
RUN = ["run", "--model", "qwen3.5-397b-a17b", "--tp", "8", "--dtype", "bf16", "--kernels", "triton_moe", "--quiet",
       "--trials", "2", "--batch-sizes", "8", "--replay", str(GRID)]

# Sends `STOP_SIGNAL` when `STOP_AT` is imported (from a string's code when STOP_IN_STRING is set),
# again when the stop's line is written when STOP_AGAIN is set, and at the very end of the
# interpreter's shutdown when STOP_AT_EXIT is set.
SITECUSTOMIZE = r'''
import atexit, os, signal, sys

SIGNAL = getattr(signal, os.environ.get("STOP_SIGNAL", "SIGINT"))
AT = os.environ.get("STOP_AT")


def stop():
    if os.environ.get("STOP_IN_STRING"):
        exec("import os\nos.kill(os.getpid(), SIGNAL)\nfor _ in range(1000): pass", {"SIGNAL": SIGNAL})
    else:
        os.kill(os.getpid(), SIGNAL)
        for _ in range(1000):
            pass


class StopAt:
    def find_spec(self, name, path=None, target=None):
        if name == AT:
            stop()
        return None


class StopAgain:
    def __init__(self, stream):
        self.stream = stream

    def write(self, text):
        if "stopped by" in text:
            os.kill(os.getpid(), SIGNAL)
            for _ in range(1000):
                pass
        return self.stream.write(text)

    def __getattr__(self, name):
        return getattr(self.stream, name)


sys.meta_path.insert(0, StopAt())
if os.environ.get("STOP_AGAIN"):
    sys.stderr = StopAgain(sys.stderr)
if os.environ.get("STOP_AT_EXIT"):
    atexit.register(lambda: os.kill(os.getpid(), SIGNAL))      # registered first: runs last
'''


def _autotune(tmp_path, argv, **stop) -> subprocess.CompletedProcess:
    """`python -m autotune ARGV` (as the Dockerfile and the tests start it) with the stops of `stop`."""
    (tmp_path / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {k: v for k, v in os.environ.items() if not k.startswith("STOP_")}
    env.update({"PYTHONPATH": os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")]),
                **{f"STOP_{k.upper()}": v for k, v in stop.items()}})
    return subprocess.run([sys.executable, "-m", "autotune", *argv], env=env, capture_output=True, text=True,
                          cwd=tmp_path, timeout=300)


@pytest.mark.parametrize("module", ["autotune.cli.parser", "autotune.problems.models", "autotune.api"])
@pytest.mark.parametrize("signal,code", [("SIGINT", 130), ("SIGTERM", 143)])
def test_a_stop_during_the_first_imports_is_one_line(tmp_path, module, signal, code):
    """A Ctrl-C in the first tenth of a second was a traceback from inside an import, and the process
    died by the signal: the handlers are installed before any import that takes time."""
    done = _autotune(tmp_path, SHAPES, at=module, signal=signal)
    assert done.returncode == code, done.stderr
    assert done.stderr.strip().splitlines() == [done.stderr.strip()] and "Traceback" not in done.stderr
    assert done.stderr.startswith(f"autotune: stopped by {signal}")


def test_a_stop_inside_code_run_from_a_string_still_exits_130(tmp_path):
    """CPython remembers a KeyboardInterrupt that ended code run from a string (dataclasses make their
    methods so) even when it is caught, and `python -m` then died by SIGINT after the line (1 run in
    5 of a Ctrl-C in the first 50 ms)."""
    done = _autotune(tmp_path, SHAPES, at="autotune.api", in_string="1")
    assert done.returncode == 130, done.stderr
    assert done.stderr.startswith("autotune: stopped by SIGINT") and "Traceback" not in done.stderr


def test_a_second_ctrl_c_while_the_stop_is_said_exits_130(tmp_path):
    done = _autotune(tmp_path, SHAPES, at="autotune.api", again="1")
    assert done.returncode == 130, done.stderr
    assert "Traceback" not in done.stderr and "KeyboardInterrupt" not in done.stderr


def test_a_ctrl_c_in_the_interpreters_shutdown_keeps_the_commands_exit(tmp_path):
    """The command had finished: its output stands, and the process ends with its code, no traceback."""
    done = _autotune(tmp_path, SHAPES, at_exit="1")
    assert done.returncode == 0, done.stderr
    assert "fused-MoE problems" in done.stdout and "no GPU visible" in done.stdout and not done.stderr.strip()


def test_an_in_process_caller_gets_its_keyboard_interrupt_back_after_a_stop(monkeypatch, capsys):
    """main's own handlers end the process at a second stop only when it is the process (argv None)."""
    import signal

    import autotune.cli as cli

    def interrupted(args):
        raise KeyboardInterrupt
    parser = cli.build_parser()
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    parser._subparsers._group_actions[0].choices["shapes"].set_defaults(fn=interrupted)
    assert main(["shapes"]) == 130
    from autotune import stops
    assert signal.getsignal(signal.SIGINT) is stops._on_signal
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)


# --- output encoding -------------------------------------------------------------------------------

def _files(folder: Path) -> dict:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_an_ascii_terminal_gets_plain_stand_ins_and_the_whole_folder(tmp_path, monkeypatch):
    """PYTHONIOENCODING=ascii: the run's table (µs) was a UnicodeEncodeError after the tuned files
    were written and before the overlay, leaving half a folder."""
    import autotune.cli.textout  # noqa: F401  (the error handler registered before the streams change)

    out = io.TextIOWrapper(io.BytesIO(), encoding="ascii", errors="strict", newline="\n")
    monkeypatch.setattr(sys, "stdout", out)
    rc = main([*RUN, "--out", str(tmp_path / "ascii"), "--storage", f"sqlite:///{tmp_path / 'a.db'}"])
    out.flush()
    printed = out.buffer.getvalue().decode("ascii")
    monkeypatch.undo()
    assert rc == 0
    assert " us" in printed and "\\xb5" not in printed, printed
    assert main([*RUN, "--out", str(tmp_path / "utf8"), "--storage", f"sqlite:///{tmp_path / 'b.db'}"]) == 0
    ascii_files, utf8_files = _files(tmp_path / "ascii"), _files(tmp_path / "utf8")
    assert sorted(ascii_files) == sorted(utf8_files) and any("triton_3_1_0" in f for f in ascii_files)


def test_the_stand_ins_are_ascii_and_keep_what_they_cannot_name():
    from autotune.cli.textout import ERRORS, plain

    assert "tuned 3.0 µs × 2 → é ü 中".encode("ascii", ERRORS) == b"tuned 3.0 us x 2 -> e u \\u4e2d"
    assert all(plain(chr(c)).isascii() for c in range(0x80, 0x3000))
    assert "µs".encode("utf-8", ERRORS) == "µs".encode("utf-8")      # an encoding that has it: unchanged


# --- outputs the file system cannot hold --------------------------------------------------------------

def _snapshot(root: Path) -> dict:
    return {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()}


def _refused_before_measuring(tmp_path, capsys, argv, says):
    before = _snapshot(tmp_path)
    capsys.readouterr()
    rc = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("autotune: error: ") and says in err[0], err
    assert _snapshot(tmp_path) == before and not (tmp_path / "out").exists()


LONG = "a" * 256


@pytest.mark.parametrize("flag", ["--record", "--json", "--out", "--worker-log"])
def test_a_name_longer_than_the_file_system_takes_is_one_line(tmp_path, capsys, flag):
    """`--record` under a folder named with 256 characters was an OSError traceback where the path
    was first looked at."""
    target = str(tmp_path / LONG / "x.jsonl.gz")
    argv = [*RUN, "--storage", f"sqlite:///{tmp_path / 'a.db'}", *(["--out", str(tmp_path / "out")] if flag != "--out"
                                                                   else []), flag, target]
    _refused_before_measuring(tmp_path, capsys, argv, f"{flag} names a file or folder 'aaaa")


def test_a_file_name_near_the_limit_is_written_not_refused_after_measuring(tmp_path, capsys):
    """A 250-character --record name fits, but its temporary copy's name did not: refused with
    'File name too long' after measuring, the tuned files already written."""
    record = tmp_path / ("r" * 247 + ".gz")
    assert main([*RUN, "--storage", f"sqlite:///{tmp_path / 'a.db'}", "--out", str(tmp_path / "out"),
                 "--record", str(record), "--json", str(tmp_path / ("j" * 250))]) == 0
    with gzip.open(record, "rt") as f:
        assert json.loads(f.readline())["kind"] == "autotune-measurement-cache"
    assert json.loads((tmp_path / ("j" * 250)).read_text())["device"] == "NVIDIA H200"


@pytest.mark.parametrize("flag", ["--record", "--json"])
def test_an_output_on_a_full_disk_is_refused_before_measuring(tmp_path, capsys, monkeypatch, flag):
    """Said only when the file was written, after measuring (and after the tuned files)."""
    real = os.statvfs
    full = str(tmp_path / "full")
    os.mkdir(full)

    def statvfs(path):
        st = real(path)
        if str(path).startswith(full):
            return os.statvfs_result((st.f_bsize, st.f_frsize, st.f_blocks, 0, 0, st.f_files, st.f_ffree,
                                      st.f_favail, st.f_flag, st.f_namemax))
        return st
    monkeypatch.setattr(os, "statvfs", statvfs)
    argv = [*RUN, "--storage", f"sqlite:///{tmp_path / 'a.db'}", "--out", str(tmp_path / "out"), flag, f"{full}/x"]
    _refused_before_measuring(tmp_path, capsys, argv, f"{flag} {full}/x: output folder {full} is on a full disk "
                                                      "(0 KiB free)")


def test_an_output_where_nothing_can_be_written_is_refused_before_measuring(tmp_path, capsys):
    argv = [*RUN, "--storage", f"sqlite:///{tmp_path / 'a.db'}", "--out", str(tmp_path / "out"), "--record",
            "/proc/autotune-test/r.jsonl.gz"]
    _refused_before_measuring(tmp_path, capsys, argv, "--record /proc/autotune-test/r.jsonl.gz: output folder "
                                                      "/proc/autotune-test is not writable")


# --- output that cannot fail the command (issue 44) ------------------------------------------------------------

MERGE = ["merge-caches", str(GRID), "-o"]


class _Failing(io.TextIOBase):
    """A stdout that fails every write as a full disk or a closed pipe does."""

    def __init__(self, err: OSError):
        self.err, self.tried = err, 0

    def write(self, text):
        self.tried += 1
        raise self.err

    def flush(self):
        pass


@pytest.mark.parametrize("err,code", [(OSError(28, "No space left on device"), 4),
                                      (BrokenPipeError(32, "Broken pipe"), 0)])
def test_a_stdout_that_fails_keeps_the_work_and_says_so_by_its_exit(tmp_path, capsys, monkeypatch, err, code):
    """`> /dev/full` was an OSError traceback from print (exit 1); `| head -1` a BrokenPipeError one: a full
    stdout is the command's report lost (exit 4, one line on stderr), a reader that stopped reading is not
    the command's failure (its own exit, nothing said)."""
    out = tmp_path / "m.jsonl.gz"
    failing = _Failing(err)
    monkeypatch.setattr(sys, "stdout", failing)
    rc = main([*MERGE, str(out)])
    monkeypatch.undo()
    said = capsys.readouterr().err.strip().splitlines()
    assert failing.tried == 1 and rc == code, (rc, said)
    with gzip.open(out, "rt") as f:                       # the work is kept
        assert json.loads(f.readline())["kind"] == "autotune-measurement-cache"
    if code == 4:
        assert len(said) == 1 and said[0].startswith("autotune: incomplete: what the command printed could not "
                                                     "be written to stdout (No space left on device)"), said
    else:
        assert said == []


def test_a_full_or_closed_stdout_of_the_process_is_no_traceback(tmp_path):
    """The process itself: its last flush at exit failed too ("Exception ignored ... BrokenPipeError", exit 120)."""
    with open(os.devnull if not os.path.exists("/dev/full") else "/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "autotune", *MERGE, str(tmp_path / "a.gz")], stdout=full,
                              stderr=subprocess.PIPE, text=True, cwd=tmp_path, timeout=300)
    if os.path.exists("/dev/full"):
        assert done.returncode == 4 and done.stderr.startswith("autotune: incomplete: "), done.stderr
        assert len(done.stderr.strip().splitlines()) == 1
    proc = subprocess.Popen([sys.executable, "-m", "autotune", *MERGE, str(tmp_path / "b.gz")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    proc.stdout.close()                                   # `| head -0`: the reader is gone before the first line
    assert proc.wait(timeout=300) == 0 and proc.stderr.read() == ""
    assert (tmp_path / "a.gz").is_file() and (tmp_path / "b.gz").is_file()


def test_a_deleted_working_folder_is_named_in_one_line(tmp_path, capsys, monkeypatch):
    """A bare "[Errno 2]" from the first relative path, or "Intel oneMKL FATAL ERROR" from `shapes`."""
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    rc = main(["shapes", "--model", "qwen3.5-397b-a17b", "--tp", "8"])
    monkeypatch.chdir(tmp_path)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err == [f"autotune: error: the working folder {gone} no longer exists (it was deleted): cd "
                               "into a folder that exists first"], err


# --- a stop says what was running (issue 44) ---------------------------------------------------------------------

def _stopped_inside(monkeypatch, command: str, measuring: bool):
    """`command`'s function replaced by one that stops itself with SIGTERM, inside a tuning loop or not."""
    import signal

    import autotune.cli as cli
    from autotune import stops

    def stopped(args):
        if measuring:
            with stops.deferred(), stops.wait():          # where a stop lands while trials are measured
                signal.raise_signal(signal.SIGTERM)
        signal.raise_signal(signal.SIGTERM)
        return 0
    parser = cli.build_parser()
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    parser._subparsers._group_actions[0].choices[command].set_defaults(fn=stopped)


@pytest.mark.parametrize("command,argv", [("publish", ["--to", "x"]), ("merge-caches", [str(GRID), "-o", "x"]),
                                          ("check", ["x"]), ("export", ["--storage", "sqlite:///x.db"])])
def test_a_stop_of_a_command_measuring_nothing_says_nothing_was_half_written(monkeypatch, capsys, command, argv):
    """SIGTERM of publish, merge-caches, check or export said "the trials being measured are marked and
    re-queued": there were none."""
    _stopped_inside(monkeypatch, command, measuring=False)
    assert main([command, *argv]) == 143
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("autotune: stopped by SIGTERM; nothing was half-written"), err
    assert "re-queued" not in err[0]


def test_a_stop_while_trials_are_measured_says_they_are_re_queued(monkeypatch, capsys):
    _stopped_inside(monkeypatch, "run", measuring=True)
    assert main(["run", "--replay", str(GRID)]) == 143
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the trials being measured are marked and re-queued" in err[0], err
