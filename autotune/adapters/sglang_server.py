"""SGLang's server as its own code defines it: the choices of its flags (the parser
`python -m sglang.launch_server` builds), its lists of backends, the config classes it registers
beside transformers', the compile-cache folders it derives, and the parser of its server arguments.
Read from the installed SGLang, never copied, so a new release's values just work; SGLang is
imported on call.
"""
from __future__ import annotations

import argparse


def flag_choices(flags: tuple[str, ...]) -> dict[str, list[str]]:
    """flag -> the values the installed SGLang's server parser takes for it (raises where SGLang is
    missing or its parser cannot be built)."""
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(add_help=False)
    ServerArgs.add_cli_args(parser)
    actions = parser._option_string_actions
    return {flag: list(actions[flag].choices) for flag in flags}


def choices_list(name: str) -> list | None:
    """SGLang's own list `name` of a flag's values (sglang.srt.arg_groups.choices); None where SGLang is
    not installed."""
    try:
        from sglang.srt.arg_groups import choices
    except ImportError:
        return None
    return getattr(choices, name)


def registered_config_classes() -> list[str]:
    """The config class names SGLang registers for models transformers does not know (empty where an
    SGLang keeps them elsewhere)."""
    try:
        from sglang.srt.utils.hf_transformers.common import _CONFIG_REGISTRY
    except Exception:
        return []
    return [c.__name__ for c in _CONFIG_REGISTRY.values()]


def compile_cache_defaults() -> dict[str, str]:
    """The compile-cache folders SGLang derives from SGLANG_CACHE_DIR as the environment has it now."""
    from sglang.srt.environ import envs, third_party_cache_defaults

    pinned = dict(third_party_cache_defaults())
    pinned["SGLANG_DG_CACHE_DIR"] = envs.SGLANG_DG_CACHE_DIR.get()
    pinned["SGLANG_CUTE_AOT_CACHE_DIR"] = envs.SGLANG_CUTE_AOT_CACHE_DIR.get()
    return pinned


def server_args_preparer():
    """SGLang's `prepare_server_args(argv)`: its server's parser and the checks it runs on the values."""
    from sglang.srt.server_args import prepare_server_args

    return prepare_server_args
