"""`autotune` commands that measure nothing (autotune.folder_commands): the flags in as keyword
arguments, the selection of what to tune as an api.TuneRequest, the lines out."""
from __future__ import annotations

import inspect

from autotune import api, folder_commands
from autotune.validate import rank_model


def _server(args):
    """install's server values from its flags (export.install.ServerFlags)."""
    from autotune.export.flashinfer import Parallel
    from autotune.export.install import ServerFlags

    return ServerFlags(args.model_path, Parallel(args.tp, args.pp, args.attn_dp, args.ep), args.dtype,
                       args.quantization, args.moe_runner_backend, args.hf_config_class,
                       tuple(s for s in args.skip_ops.split(",") if s))


# A command's parameters that are one value made of several flags: the selection of what to tune
# (an api.TuneRequest) and the server install writes for.
_MADE = {"sel": lambda args: api.request(api.TuneRequest, args), "server": _server}


def _printed(fn):
    def cmd(args) -> int:
        params = inspect.signature(fn).parameters
        kw = {k: getattr(args, k) for k in params if k not in _MADE and hasattr(args, k)}
        kw.update({k: make(args) for k, make in _MADE.items() if k in params})
        out = fn(**kw)
        code, lines = out if isinstance(out, tuple) else (0, out)
        for line in lines:
            print(line)
        return code
    return cmd


COMMANDS = {"shapes": folder_commands.shapes, "publish": folder_commands.publish,
            "merge-caches": folder_commands.merge_caches, "install": folder_commands.install,
            "rank-model": rank_model.command, "compile-limits": folder_commands.compile_limits,
            "check": folder_commands.check, "merge-choices": folder_commands.merge_choices}
commands = {name: _printed(fn) for name, fn in COMMANDS.items()}
