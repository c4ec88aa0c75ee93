"""Server and benchmark processes: started in their own process group, health-checked, always stopped."""
from __future__ import annotations

import atexit
import os
import shlex
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from autotune import programs
from autotune.validate import BenchmarkError, ServerError
from autotune.validate.sglang_commands import LOOPBACK, check_port_free


# --- processes --------------------------------------------------------------------------------

_LIVE: set = set()


def _stop_all() -> None:
    for p in list(_LIVE):
        p.stop()


atexit.register(_stop_all)


def _group_alive(pgid: int) -> bool:
    """Does any non-zombie process remain in process group `pgid`?"""
    proc = Path("/proc")
    if proc.is_dir():
        for d in proc.iterdir():
            if not d.name.isdigit():
                continue
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            rest = stat[stat.rfind(")") + 2:].split()
            if len(rest) > 2 and int(rest[2]) == pgid and rest[0] != "Z":
                return True
        return False
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _kill_group(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM to the process group, SIGKILL to what is left after `grace_s`."""
    pgid = proc.pid              # started with start_new_session: its pid is the group id
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            proc.poll()
            if not _group_alive(pgid):
                break
            time.sleep(0.1)
        if not _group_alive(pgid):
            break
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def _tail(path: Path, lines: int = 30) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return "(no log)"
    rows = text.rstrip("\n").splitlines()[-lines:]
    return "\n".join("    " + r for r in rows) if rows else "    (empty log)"


@dataclass(frozen=True)
class Lifecycle:
    """How a server is brought up and down: GET `health_path` every `poll_s` seconds until it answers
    200 or `health_timeout_s` have passed; `shutdown_grace_s` between SIGTERM to its group and SIGKILL."""
    health_timeout_s: float = 1800.0
    poll_s: float = 2.0
    shutdown_grace_s: float = 30.0
    health_path: str = "/health_generate"


class ServerProcess:
    """A server in its own process group: started, waited on until healthy, always shut down
    (SIGTERM to the group, SIGKILL after the lifecycle's grace), also on Ctrl-C and exceptions."""

    def __init__(self, argv: list[str], *, port: int, log_path: str | Path, env: dict | None = None,
                 host: str = LOOPBACK, name: str = "SGLang server", lifecycle: Lifecycle = Lifecycle()):
        self.argv, self.port, self.host = list(argv), port, host
        self.log_path = Path(log_path)
        self.env = env
        self.lifecycle = lifecycle
        self.name = name
        self.proc: subprocess.Popen | None = None
        self.healthy_after_s: float | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> None:
        check_port_free(self.port, self.host)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        try:
            log.write(("$ " + shlex.join(self.argv) + "\n").encode())
            log.flush()
            self.proc = programs.start(self.argv, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            log.close()
        _LIVE.add(self)

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.base_url + self.lifecycle.health_path, timeout=30) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def wait_healthy(self) -> float:
        life = self.lifecycle
        t0 = time.monotonic()
        deadline = t0 + life.health_timeout_s
        while True:
            rc = self.proc.poll()
            if rc is not None:
                raise ServerError(f"{self.name} exited with code {rc} before it became healthy; "
                                  f"last lines of {self.log_path}:\n{_tail(self.log_path)}")
            if self._healthy():
                self.healthy_after_s = time.monotonic() - t0
                return self.healthy_after_s
            if time.monotonic() > deadline:
                raise ServerError(f"{self.name} not healthy after {life.health_timeout_s:.0f} s "
                                  f"(GET {self.base_url}{life.health_path}); last lines of {self.log_path}:\n"
                                  f"{_tail(self.log_path)}")
            time.sleep(life.poll_s)

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        _LIVE.discard(self)
        if proc is not None:
            _kill_group(proc, self.lifecycle.shutdown_grace_s)

    def __enter__(self) -> "ServerProcess":
        self.start()
        try:
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def run_logged(cmd: list[str], *, log_path: str | Path, timeout_s: float, what: str,
               env: dict | None = None) -> float:
    """Run a command in its own process group, output to `log_path`; returns wall seconds.
    Non-zero exit or time-out: BenchmarkError with the log tail; the group is killed on any
    exit path (time-out, Ctrl-C, exception)."""
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with open(log_path, "ab") as log:
        log.write(("$ " + shlex.join(cmd) + "\n").encode())
        log.flush()
        proc = programs.start(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                              start_new_session=True)
    try:
        rc = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc, 10.0)
        raise BenchmarkError(f"{what} did not finish in {timeout_s:.0f} s; last lines of {log_path}:\n"
                             f"{_tail(log_path)}") from None
    except BaseException:
        _kill_group(proc, 10.0)
        raise
    if _group_alive(proc.pid):
        _kill_group(proc, 5.0)
    if rc != 0:
        raise BenchmarkError(f"{what} exited with code {rc}; last lines of {log_path}:\n{_tail(log_path)}")
    return time.monotonic() - t0
