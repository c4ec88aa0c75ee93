"""A kernel family whose configs misbehave on purpose, to test the worker isolation.

config["mode"]: ok | nan_at_2 (NaN at M=2 only) | zeros | unwritten | crash (SIGSEGV) |
hang | compile (compile error) | oor (out of resources) | cuda_fatal (poisoned context) |
oom_once (torch's out-of-memory the first time at each M: a resource failure, then fine) |
cuda_oom_once (CUDA's own out-of-memory, which poisons the context, the first time at each M) |
oom_always (out of memory every time). The *_once modes count their tries in files under the folder
$FAULTY_STATE, shared by every worker process (they inherit the test's environment).
"""
import os
import signal
import threading
from types import SimpleNamespace

from autotune.contract.spaces import Space

MODES = ("ok", "nan_at_2", "zeros", "unwritten", "crash", "hang", "compile", "oor", "cuda_fatal", "oom_once",
         "cuda_oom_once", "oom_always")


def first_time(config, M) -> bool:
    """True the first time any worker asks for (config, M): a file under $FAULTY_STATE says it was."""
    mark = os.path.join(os.environ["FAULTY_STATE"], f"{config['mode']}-{M}")
    try:
        os.close(os.open(mark, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False


class CompilationError(Exception):
    pass


class OutOfResources(Exception):
    pass


class Faulty:
    name = "faulty"
    gemms = ("g",)

    def unsupported_reason(self, problem, device):
        return None

    def space(self, problem, gemm, device):
        return Space("faulty", {"mode": MODES})

    def check(self, config, problem, gemm, device):
        return None

    def unwritable(self, config, gemm, device):
        return None

    def baselines(self, problem, M, device):
        return {}

    def warmup(self, problems, on_cpu=False):
        pass

    def make_inputs(self, problem, gemm, M, *, seed=0, skew=0.0, routings=1, on_cpu=True):
        import torch
        return SimpleNamespace(M=M, C=torch.empty(8), x=torch.arange(8.0) + M)

    def compile(self, config, inputs):
        if config["mode"] == "compile":
            # As Triton fails: MLIR's pass manager writes its dump to file descriptor 2 from C++,
            # and the exception holds a location, a source excerpt and the message last.
            os.write(2, b"// -----// IR Dump Before TritonGPUPipeline //----- //\nmodule {\n  tt.func @k() {\n")
            raise CompilationError("at 12:4:\n    acc = tl.dot(a, b, acc)\n    ^\nunsupported layout")

    def run(self, config, inputs, routing):
        mode = config["mode"]
        if mode == "crash":
            os.kill(os.getpid(), signal.SIGSEGV)
        if mode == "hang":
            threading.Event().wait()
        if mode == "oor":
            raise OutOfResources("out of resource: shared memory, Required: 262144, Hardware limit: 232448")
        if mode == "cuda_fatal":
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        if mode == "oom_always" or (mode == "oom_once" and first_time(config, inputs.M)):
            import torch
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
                                         "capacity of 79.19 GiB of which 1.06 GiB is free.")
        if mode == "cuda_oom_once" and first_time(config, inputs.M):
            raise RuntimeError("CUDA error: out of memory")
        if mode == "unwritten":
            return inputs.C
        inputs.C.copy_(inputs.x)
        if mode == "zeros":
            inputs.C.zero_()
        if mode == "nan_at_2" and inputs.M == 2:
            inputs.C[3] = float("nan")
        return inputs.C

    def reference(self, inputs, config=None):
        return inputs.x

    def tolerance(self, problem, on_cpu=False):
        return 1e-6


class OomFaulty(Faulty):
    """Two configs: one that runs, one that runs out of GPU memory the first time at each M."""
    name = "oom_faulty"
    spec = "tests.fakes.faulty_family:OomFaulty"

    def space(self, problem, gemm, device):
        return Space("oom_faulty", {"mode": ("ok", "oom_once")})


class FaultyBuilds(Faulty):
    """Compiles apart (autotune.measure.builders), and config["build"] misbehaves in the builder only:
    "ok" | "error" (the compile raises) | "crash" (SIGSEGV) | "hang". Each build leaves a file
    `built-<mode>-<build>-<M>` under $FAULTY_STATE, so a test sees what was built apart; its measuring is
    Faulty's (config["mode"])."""
    name = "faulty_builds"
    spec = "tests.fakes.faulty_family:FaultyBuilds"
    compiles_apart = True

    def compiling_for(self, sm):
        import contextlib
        assert os.environ.get("CUDA_VISIBLE_DEVICES") == "", "a builder sees no GPU"
        return contextlib.nullcontext()

    def compile_apart(self, config, problem, gemm, M):
        build = config.get("build", "ok")
        if build == "crash":
            os.kill(os.getpid(), signal.SIGSEGV)
        if build == "hang":
            threading.Event().wait()
        if build == "error":
            raise CompilationError("at 1:1:\nbuild apart failed")
        open(os.path.join(os.environ["FAULTY_STATE"], f"built-{config['mode']}-{build}-{M}"), "w").close()


class OomBeforeLaunch(Faulty):
    """Out of GPU memory before any launch: config["mode"] "oom_building" while its inputs are built,
    "oom_compiling" while its kernel compiles (torch's allocator refusing, as on a GPU)."""
    name = "oom_before_launch"
    spec = "tests.fakes.faulty_family:OomBeforeLaunch"

    def space(self, problem, gemm, device):
        return Space("oom_before_launch", {"mode": ("oom_building", "oom_compiling")})

    @staticmethod
    def _oom():
        import torch
        return torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
                                      "of 79.19 GiB of which 1.06 GiB is free.")

    def prepare(self, config, inputs):       # part of building the inputs: for this config, before it compiles
        if config["mode"] == "oom_building":
            raise self._oom()

    def compile(self, config, inputs):
        if config["mode"] == "oom_compiling":
            raise self._oom()


def run_all(pool, tasks, key="mode", limit=180):
    """Every task through `pool` (submitted as it takes them, polled until none is busy): config[key] -> {M:
    measurement}. Fails when the pool has not finished within `limit` seconds."""
    import time

    out, queue, t0 = {}, list(tasks), time.monotonic()
    while queue or pool.busy():
        assert time.monotonic() - t0 < limit, "pool did not finish"
        while queue and pool.idle():
            pool.submit(queue.pop(0))
        for task, ms in pool.poll(timeout=0.2):
            out[task.config[key]] = {m.M: m for m in ms}
    return out
