"""`autotune` commands that measure nothing (autotune.folder_commands): the flags in as keyword
arguments, the selection of what to tune as an api.TuneRequest, the lines out."""
from __future__ import annotations

import inspect

from autotune import api, folder_commands
from autotune.validate import rank_model


def _printed(fn):
    def cmd(args) -> int:
        params = inspect.signature(fn).parameters
        kw = {k: getattr(args, k) for k in params if k != "sel" and hasattr(args, k)}
        if "sel" in params:
            kw["sel"] = api.request(api.TuneRequest, args)
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
