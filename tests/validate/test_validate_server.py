"""ServerProcess / run_logged against a small local STAND-IN HTTP process started by the test.

The stand-in exists only to exercise start, health wait, time-out, exit and kill handling; it
measures nothing and never stands in for SGLang in a validation. Also: port-in-use and
bad-model-dir errors of `autotune validate` (exit code 2, no process left).
"""
import argparse
import os
import re
import shlex
import signal
import socket
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from autotune.validate import BenchmarkError, PortInUseError, ServerError
from autotune.validate.server_process import Lifecycle, ServerProcess, run_logged
from autotune.validate.sglang_commands import free_port, port_in_use

STANDIN = textwrap.dedent('''
    """Stand-in HTTP process for autotune's process-manager tests (not a model server)."""
    import argparse, http.server, os, signal, subprocess, sys

    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--healthy-after", type=int, default=0, help="health checks answered 503 first")
    ap.add_argument("--never-healthy", action="store_true")
    ap.add_argument("--exit-now", type=int)
    ap.add_argument("--ignore-term", action="store_true")
    ap.add_argument("--child-pidfile")
    ap.add_argument("--pidfile")
    a = ap.parse_args()
    if a.pidfile:
        open(a.pidfile, "w").write(str(os.getpid()))
    print("stand-in starting: marker-7f3a", flush=True)
    if a.exit_now is not None:
        print("stand-in failing on purpose: marker-exit", flush=True)
        sys.exit(a.exit_now)
    if a.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if a.child_pidfile:
        child = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"])
        open(a.child_pidfile, "w").write(str(child.pid))
    asked = []

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            asked.append(self.path)
            ok = not a.never_healthy and len(asked) > a.healthy_after
            code = 200 if ok and self.path == "/health_generate" else 503
            print(f"health check {len(asked)}: {code}", flush=True)
            self.send_response(code)
            self.end_headers()

        def log_message(self, *args):
            pass

    http.server.HTTPServer(("127.0.0.1", a.port), H).serve_forever()
''')


@pytest.fixture
def standin(tmp_path):
    path = tmp_path / "standin_http_process.py"
    path.write_text(STANDIN)

    def argv(port, *extra):
        return [sys.executable, str(path), "--port", str(port), *extra]
    return argv


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"


def test_start_wait_healthy_and_stop_kills_the_whole_group(standin, tmp_path):
    port = free_port()
    pidfile = tmp_path / "child.pid"
    srv = ServerProcess(standin(port, "--healthy-after", "3", "--child-pidfile", str(pidfile)), port=port,
                        log_path=tmp_path / "s.log", lifecycle=Lifecycle(20, poll_s=0.1, shutdown_grace_s=5))
    with srv:
        # the block starts after the first healthy answer, not before, and asked nothing more
        answers = re.findall(r"^health check \d+: (\d+)$", (tmp_path / "s.log").read_text(), re.M)
        assert answers == ["503", "503", "503", "200"] and srv.healthy_after_s > 0
        pid, child = srv.proc.pid, int(pidfile.read_text())
        assert _alive(pid) and _alive(child) and port_in_use(port)
    assert srv.proc is None
    assert not _alive(pid) and not _alive(child)        # the child in its group is gone too
    assert not port_in_use(port)
    assert "marker-7f3a" in (tmp_path / "s.log").read_text()


def test_never_healthy_times_out_with_the_log_tail_and_stops(standin, tmp_path):
    port = free_port()
    srv = ServerProcess(standin(port, "--never-healthy"), port=port, log_path=tmp_path / "s.log",
                        lifecycle=Lifecycle(1.5, poll_s=0.1, shutdown_grace_s=5))
    with pytest.raises(ServerError) as e:
        with srv:
            pytest.fail("must not get here")
    msg = str(e.value)
    assert "not healthy after 2 s" in msg and "/health_generate" in msg and "marker-7f3a" in msg
    assert srv.proc is None and not port_in_use(port)


def test_server_that_exits_during_start_up_is_reported_with_its_code(standin, tmp_path):
    port = free_port()
    with pytest.raises(ServerError) as e:
        with ServerProcess(standin(port, "--exit-now", "3"), port=port, log_path=tmp_path / "s.log",
                           lifecycle=Lifecycle(20, poll_s=0.1)):
            pass
    assert "exited with code 3 before it became healthy" in str(e.value)
    assert "marker-exit" in str(e.value)


def test_sigterm_ignored_escalates_to_sigkill(standin, tmp_path):
    port = free_port()
    srv = ServerProcess(standin(port, "--ignore-term"), port=port, log_path=tmp_path / "s.log",
                        lifecycle=Lifecycle(20, poll_s=0.1, shutdown_grace_s=0.5))
    with srv:
        pid = srv.proc.pid
    assert not _alive(pid)          # gone when the block ends: SIGKILL after the grace period


@pytest.mark.parametrize("exc", [RuntimeError("benchmark blew up"), KeyboardInterrupt()])
def test_exceptions_and_ctrl_c_inside_the_block_still_stop_the_server(standin, tmp_path, exc):
    port = free_port()
    srv = ServerProcess(standin(port), port=port, log_path=tmp_path / "s.log",
                        lifecycle=Lifecycle(20, poll_s=0.1, shutdown_grace_s=5))
    with pytest.raises(type(exc)):
        with srv:
            pid = srv.proc.pid
            raise exc
    assert not _alive(pid) and not port_in_use(port)


def test_port_in_use_is_refused_before_anything_starts(standin, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        srv = ServerProcess(standin(port), port=port, log_path=tmp_path / "s.log")
        with pytest.raises(PortInUseError, match=f"port {port} on 127.0.0.1 is in use"):
            with srv:
                pass
        assert srv.proc is None and not (tmp_path / "s.log").exists()


def test_benchmark_exiting_non_zero_or_hanging_is_an_error_with_its_output(tmp_path):
    with pytest.raises(BenchmarkError, match=r"exited with code 4(.|\n)*no server answered"):
        run_logged([sys.executable, "-c", "print('no server answered'); raise SystemExit(4)"],
                   log_path=tmp_path / "b.log", timeout_s=30, what="serving at concurrency 8")
    with pytest.raises(BenchmarkError, match="did not finish in 1 s"):
        # -S: no site-packages to read first, so the process has said its pid well inside its 1 s on a loaded
        # machine (with the venv's site it sometimes had not, and the log was empty)
        run_logged([sys.executable, "-S", "-c", "import os, signal; print('hanging pid=%d' % os.getpid(), flush=True); "
                    "signal.pause()"], log_path=tmp_path / "h.log", timeout_s=1, what="one_batch_server")
    hung = int(re.search(r"hanging pid=(\d+)", (tmp_path / "h.log").read_text()).group(1))
    assert not _alive(hung)         # killed at its timeout, not waited for
    # success: the log holds the command line and its output, and what the command left running in
    # its process group (a background child) is killed before run_logged returns
    cmd = [sys.executable, "-c", "import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', "
           "'import signal; signal.pause()']); print('ok, child pid=%d' % p.pid, flush=True)"]
    run_logged(cmd, log_path=tmp_path / "ok.log", timeout_s=30, what="ok")
    log = (tmp_path / "ok.log").read_text()
    assert log.splitlines()[0] == "$ " + shlex.join(cmd)
    child = int(re.search(r"ok, child pid=(\d+)", log).group(1))
    assert not _alive(child)


# --- autotune validate: bad input -> exit code 2, one message --------------------------------------

def _validate(argv, capsys):
    from autotune.cli.validate import add_parser

    ap = argparse.ArgumentParser(prog="autotune")
    add_parser(ap.add_subparsers(dest="cmd"))
    args = ap.parse_args(["validate", *argv])
    rc = args.fn(args)
    return rc, capsys.readouterr().err


@pytest.fixture
def configs(tmp_path):
    d = tmp_path / "tuned_configs" / "NVIDIA_RTX_PRO_6000"
    (d / "configs" / "triton_3_5_1").mkdir(parents=True)
    (d / "configs" / "triton_3_5_1" / "E=512,N=128,device_name=NVIDIA_RTX_PRO_6000.json").write_text("{}")
    return d


def test_model_dir_without_config_json_exits_2(tmp_path, configs, capsys):
    model = tmp_path / "model"
    model.mkdir()
    (model / "tokenizer.json").write_text("{}")
    rc, err = _validate(["--engine", "sglang", "--model-path", str(model), "--configs", str(configs)], capsys)
    assert rc == 2
    assert err.strip().splitlines() == [f"autotune: error: model folder {model} has no config.json: SGLang cannot serve it"]


def test_port_in_use_exits_2_before_any_server_starts(tmp_path, configs, capsys):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "tokenizer.json").write_text("{}")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        rc, err = _validate(["--engine", "sglang", "--model-path", str(model), "--configs", str(configs),
                             "--port", str(port)], capsys)
    assert rc == 2 and f"port {port} on 127.0.0.1 is in use" in err and len(err.strip().splitlines()) == 1
    assert not (configs / "validation_runs").exists()
    assert not _processes_mentioning(str(model))


def _processes_mentioning(text: str) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if text.encode() in (d / "cmdline").read_bytes() and _alive(int(d.name)):
                    out.append(int(d.name))
            except OSError:
                pass
    return out


def test_empty_configs_folder_and_engine_mix_ups_exit_2(tmp_path, capsys):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "tokenizer.json").write_text("{}")
    empty = tmp_path / "empty"
    empty.mkdir()
    rc, err = _validate(["--engine", "sglang", "--model-path", str(model), "--configs", str(empty)], capsys)
    assert rc == 2 and "holds nothing SGLang would load" in err
    rc, err = _validate(["--engine", "harness", "--configs", str(empty)], capsys)
    assert rc == 2 and "needs one of --model" in err
    rc, err = _validate(["--engine", "sglang", "--model-path", str(model), "--configs", str(empty),
                         "--batch-sizes", "1,2"], capsys)
    assert rc == 2 and "--concurrencies" in err


def test_sigterm_becomes_keyboard_interrupt_while_validating():
    from autotune.cli.validate import _SigtermAsInterrupt

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):
        with _SigtermAsInterrupt():
            os.kill(os.getpid(), signal.SIGTERM)
            threading.Event().wait(30)     # the handler raises in this thread (a deadline, not a sleep)
    assert signal.getsignal(signal.SIGTERM) == before


def test_runner_stops_the_server_when_a_benchmark_fails(standin, tmp_path, monkeypatch):
    """run_server_validation's control flow with the stand-in in the server's place and a failing
    command in the benchmark's (error handling only: nothing is measured)."""
    from autotune.validate import sglang_server as ss

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "tokenizer.json").write_text("{}")
    cfg = tmp_path / "tc"
    (cfg / "configs" / "triton_3_5_1").mkdir(parents=True)
    (cfg / "configs" / "triton_3_5_1" / "E=8,N=32,device_name=X.json").write_text("{}")
    from autotune.validate.sglang_inputs import inspect_configs, inspect_model_dir
    v = ss.ServerValidation(model=inspect_model_dir(model), configs=inspect_configs(cfg),
                            work_dir=tmp_path / "work", concurrencies=(8,), repeats=1, health_timeout_s=20)
    seen = {}

    def server_spec(self, side, repeat, port):
        seen["port"] = port
        env = {"SGLANG_CACHE_DIR": str(tmp_path / "work" / side / "cache")}
        return standin(port, "--pidfile", str(tmp_path / "server.pid")), env, tmp_path / "work" / side

    def commands(self, side, repeat, port):
        bench = [sys.executable, "-c", "print('benchmark failing'); raise SystemExit(5)",
                 "--max-concurrency", "8", "--output-file", "x"]
        return [standin(port, "--pidfile", str(tmp_path / "server.pid")), bench]

    monkeypatch.setattr(ss.ServerValidation, "server_spec", server_spec)
    monkeypatch.setattr(ss.ServerValidation, "commands", commands)
    with pytest.raises(BenchmarkError, match="serving at concurrency 8 \\(baseline, repeat 0\\) exited with code 5"):
        ss.run_server_validation(v, log=lambda *a: None)
    assert not port_in_use(seen["port"])
    assert not _alive(int((tmp_path / "server.pid").read_text()))
