"""Failure evidence that names a line a reader can open: where an error was raised, and where a
hung worker waits (from the stack faulthandler dumps)."""
import subprocess
import sys

from autotune.measure.frames import raised_at, stuck_at

SCRIPT = '''
import faulthandler, sys, threading

def waiting_here():
    faulthandler.dump_traceback(file=sys.stdout, all_threads=True)

release = threading.Event()
helper = threading.Thread(target=release.wait, daemon=True)
helper.start()                   # returns once the thread runs: its block is in the dump
waiting_here()
release.set()
'''


def test_stuck_at_names_the_main_threads_own_frame(tmp_path):
    script = tmp_path / "hung_worker.py"
    script.write_text(SCRIPT)
    dump = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=True).stdout
    assert dump.count("(most recent call first)") == 2     # the helper thread's block comes first
    assert stuck_at(dump) == "hung_worker.py:5 in waiting_here"


def test_stuck_at_skips_the_standard_library():
    import subprocess as sp
    lib = sp.__file__
    dump = ("Current thread 0x00007f (most recent call first):\n"
            f'  File "{lib}", line 1264 in wait\n'
            '  File "/opt/venv/lib/python3.12/site-packages/torch/utils/cpp_extension.py", line 2100 in _run_ninja_build\n'
            f'  File "{lib}", line 10 in run\n')
    assert stuck_at(dump).endswith("torch/utils/cpp_extension.py:2100 in _run_ninja_build")
    assert stuck_at("Fatal Python error: nothing") == ""


def test_raised_at_follows_the_cause():
    def inner():
        return None.runner_backend

    try:
        try:
            inner()
        except AttributeError as e:
            raise RuntimeError("first launch") from e
    except RuntimeError as outer:
        where = raised_at(outer)
    assert where == f"tests/measure/test_frames.py:{inner.__code__.co_firstlineno + 1}"
