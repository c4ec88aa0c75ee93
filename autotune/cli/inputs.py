"""The command line's values, typed once: every numeric flag, list and path goes through one of
these argparse types, so a bad value is refused by the parser in one line (`BadInput`, exit 2)
before any command runs, and the commands only see values in range.

Durations need a unit (`--budget 20` was silently 20 seconds); counts are integers (a bool or a
float is not one); floats are finite; output paths are named.
"""
from __future__ import annotations

import argparse
import math
import os
import re
import shlex
import shutil

from autotune.errors import one_line
from autotune.gpus.catalog import MAX_GPUS

# argparse shows these names in its own messages ("invalid count value"): we say what is wrong instead.
DURATION_FORMS = "90s, 20m or 1.5h"
MAX_SECONDS = 30 * 24 * 3600        # a duration flag's most: 30 days
_UNITS = {"s": 1, "m": 60, "h": 3600}
# The most GPUs one server spans (its tp x pp ranks, one file each for install): far above any
# deployment, far below the thousands of files a typo's --tp 5000 wrote.


class BadInput(Exception):
    """A flag's value (or the command line itself) is wrong: one line, exit 2."""




def _noting(base, once: bool):
    """`base` (an argparse action class) that notes on the parser which flags were given: a flag of
    one value (`once`) given twice is refused (argparse kept the last value in silence: `--replay a
    --replay b` dropped a), as is a second flag setting the same thing (worker's --gpu and --gpus)."""
    class Noted(base):
        def __call__(self, parser, namespace, values, option_string=None):
            given = parser.__dict__.setdefault("given", {})         # dest -> (action, flag) that set it first
            first = given.get(self.dest)
            if once and first is not None:
                raise argparse.ArgumentError(self, "is given twice: give it once (the second replaced the first)"
                                             if first[0] is self else
                                             f"is given with {first[1]}, which sets the same: give one")
            given.setdefault(self.dest, (self, option_string))
            if base is argparse._AppendAction and self.type is path:
                _named_once(self, getattr(namespace, self.dest, None) or [], values)
            super().__call__(parser, namespace, values, option_string)
    Noted.__name__ = base.__name__
    return Noted


def _named_once(action, earlier: list, value: str) -> None:
    """A repeatable flag naming files or folders names each once (`validate --from-runs X --from-runs X`
    counted every run twice: a gate judged on 6 runs a side where 3 were made)."""
    where = os.path.realpath(value)
    same = next((e for e in earlier if os.path.realpath(e) == where), None)
    if same is not None:
        raise argparse.ArgumentError(action, f"names {same!r} twice ({value!r} is the same): name each once")


class Parser(argparse.ArgumentParser):
    """argparse, with its errors one line each (`autotune: error: --flag ...`) raised, not printed
    with the usage and a SystemExit: main says it and returns 2 (in-process callers see the code).

    Beyond argparse: a single-valued flag given twice is refused, a flag of free text given an empty
    value is refused (`--dtype ''` read as no --dtype: every dtype), and the relations a command
    declares between its flags (`needs`, `excludes`, beside argparse's mutually exclusive groups) are
    checked once every flag is read."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for name, base, once in ((None, argparse._StoreAction, True), ("store", argparse._StoreAction, True),
                                 ("store_true", argparse._StoreTrueAction, False),
                                 ("store_false", argparse._StoreFalseAction, False),
                                 ("append", argparse._AppendAction, False)):
            self.register("action", name, _noting(base, once))
        self.relations: list[tuple[str, str, str, str]] = []     # (kind, flag, other flag, why)

    def needs(self, flag: str, other: str, why: str) -> None:
        """`flag` means something only with `other`."""
        self.relations.append(("needs", flag, other, why))

    def excludes(self, flag: str, others, why: str) -> None:
        """`flag` contradicts each of `others`."""
        self.relations.extend(("excludes", flag, other, why) for other in others)

    def parse_known_args(self, args=None, namespace=None):
        self.given = {}
        parsed, rest = super().parse_known_args(args, namespace)
        named = {flag: action.dest for action in self._actions for flag in action.option_strings}
        for kind, flag, other, why in self.relations:
            has, has_other = named[flag] in self.given, named[other] in self.given
            if kind == "needs" and has and not has_other:
                self.error(f"{flag} needs {other} ({why})")
            if kind == "excludes" and has and has_other:
                self.error(f"{flag} and {other} exclude each other ({why}): give one")
        return parsed, rest

    def _get_values(self, action, arg_strings):
        # argparse drops a lone '--' (`--out=--`) and hands the flag an empty list instead of a value
        if action.nargs is None and arg_strings == ["--"]:
            raise argparse.ArgumentError(action, "must name a value, got '--'")
        # free text read as "not given" when empty; a flag whose own default is empty may be given so
        if isinstance(action, argparse._StoreAction) and action.nargs is None and action.type is None \
                and action.option_strings and action.default != "" and len(arg_strings) == 1 \
                and not arg_strings[0].strip():
            raise argparse.ArgumentError(action, f"must name a value, got {arg_strings[0]!r}")
        return super()._get_values(action, arg_strings)

    def error(self, message: str):
        m = re.fullmatch(r"argument (\S+): (.*)", message, re.S)
        if m:
            flag, what = m.group(1).split("/")[-1], m.group(2)
            other = re.fullmatch(r"not allowed with argument (\S+)", what)      # a mutually exclusive group's
            message = (f"{other.group(1).split('/')[-1]} and {flag} exclude each other: give one" if other else
                       f"{flag} {what}" if what.startswith(("must ", "has ", "lists ", "is ", "names ", "holds "))
                       else f"{flag}: {what}")
        raise BadInput(f"{message} ({self.prog} --help lists the flags)"
                       if "unrecognized arguments" in message or "required" in message else message)


def _typed(fn, name: str):
    fn.__name__ = name          # argparse names the type in its fallback message
    return fn


def _bound(x) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"     # 4294967295, not 4.29497e+09


def _shown(x) -> str:
    t = str(x)
    return t if len(t) <= 40 else f"{t[:12]}... ({len(t)} characters)"


def _in_range(v, shown, least, most):
    if v < least:
        raise argparse.ArgumentTypeError(f"must be at least {_bound(least)}, got {_shown(shown)}")
    if most is not None and v > most:
        raise argparse.ArgumentTypeError(f"must be at most {_bound(most)}, got {_shown(shown)}")
    return v


def count(least: int = 1, most: int | None = None):
    """An integer >= `least` (and <= `most`)."""
    def parse(text: str) -> int:
        t = str(text).strip()
        if not re.fullmatch(r"-?[0-9]+", t):      # int() also takes '8_0' (80) and other scripts' digits
            raise argparse.ArgumentTypeError(f"must be an integer, got {text!r:.40}")
        v = int(t)
        return _in_range(v, v, least, most)
    return _typed(parse, "count")


def number(least: float = 0.0, positive: bool = False, most: float | None = None):
    """A finite float >= `least` (> 0 with `positive`)."""
    def parse(text: str) -> float:
        try:
            v = float(str(text).strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number, got {text!r:.40}") from None
        if not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
        if positive and v <= 0:
            raise argparse.ArgumentTypeError(f"must be above 0, got {text!r}")
        return _in_range(v, repr(text), least, most)
    return _typed(parse, "number")


def seconds(text: str) -> float:
    """A duration with its unit: 90s, 20m, 1.5h -> seconds (> 0)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?|\.\d+)\s*([smh])\s*", str(text))
    if not m:
        if re.fullmatch(r"\s*\d+(?:\.\d+)?\s*", str(text)):
            raise argparse.ArgumentTypeError(f"has no unit in {text!r}: write it as {DURATION_FORMS}")
        raise argparse.ArgumentTypeError(f"must look like {DURATION_FORMS}, got {text!r}")
    v = float(m.group(1)) * _UNITS[m.group(2)]
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive duration, got {text!r}")
    if v > MAX_SECONDS:     # beyond it a typo (and 400 digits are an infinite float); no limit: leave it out
        raise argparse.ArgumentTypeError(f"must be at most {MAX_SECONDS // 3600}h (leave it out for no limit), "
                                         f"got {text!r:.40}")
    return v


seconds = _typed(seconds, "duration")


def int_list(limit: tuple[int, str] | None = None):
    """A comma-separated list of distinct positive integers (models.parse_int_list's rules)."""
    def parse(text: str) -> tuple[int, ...]:
        from autotune.problems.models import ModelError, parse_int_list
        try:
            return parse_int_list(text, "", limit)
        except ModelError as e:
            raise argparse.ArgumentTypeError(str(e).lstrip(": ")) from None
    return _typed(parse, "list")


def dtypes(text: str) -> str:
    """A comma-separated list of autotune's dtypes (models.DTYPES), each once."""
    from autotune.problems.models import DTYPES

    names = [n.strip() for n in str(text).split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(f"has an empty entry in {text!r}: write it as bf16,fp8_w8a8")
    unknown = [n for n in names if n not in DTYPES]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown dtype {unknown[0]!r:.40}; known: {', '.join(DTYPES)}")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise argparse.ArgumentTypeError(f"lists {', '.join(twice)} twice")
    return ",".join(names)


dtypes = _typed(dtypes, "dtypes")


def shard(text: str) -> tuple[int, int]:
    """i/n: every n-th config starting at i, 0 <= i < n."""
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", str(text))
    if not m:
        raise argparse.ArgumentTypeError(f"must look like i/n (e.g. 0/4), got {text!r}")
    i, n = int(m.group(1)), int(m.group(2))
    if n < 1 or i >= n:
        raise argparse.ArgumentTypeError(f"must have 0 <= i < n, got {text!r}")
    return i, n


shard = _typed(shard, "shard")


def gpus(text: str) -> str:
    """'all' or a list of GPU indices."""
    if str(text).strip() == "all":
        return "all"
    if not re.fullmatch(r"\s*[0-9]+(\s*,\s*[0-9]+)*\s*", str(text)):
        raise argparse.ArgumentTypeError(f"must be 'all' or GPU indices like 0,1, got {text!r}")
    indices = [int(g) for g in str(text).split(",")]
    if len(set(indices)) != len(indices):     # two measuring pools on one GPU time each other's kernels
        raise argparse.ArgumentTypeError(f"lists a GPU twice in {text!r}: name each once")
    return ",".join(map(str, indices))


gpus = _typed(gpus, "gpus")


def sm(text: str) -> int:
    """A compute capability autotune knows (gpus.SMEM_OPTIN)."""
    from autotune.gpus.catalog import SMEM_OPTIN
    v = count(1)(text)
    if v not in SMEM_OPTIN:
        raise argparse.ArgumentTypeError(f"must be a known compute capability ({', '.join(map(str, sorted(SMEM_OPTIN)))}), "
                                         f"got {v}")
    return v


sm = _typed(sm, "sm")


def path(text: str) -> str:
    """A named file or folder (an empty string is not one) whose name the file system can hold:
    a part longer than its names may be was an OSError traceback where the path was first looked at,
    or a refusal only when the file was written, after measuring."""
    from autotune.fileio.writing import name_problem

    if not str(text).strip():
        raise argparse.ArgumentTypeError("must name a path, got ''")
    if not str(text).isprintable():     # a pasted newline, an escape: printed raw, it split or drove the terminal
        raise argparse.ArgumentTypeError(f"holds a control character: {text!r:.80}")
    why = name_problem(text)
    if why:
        raise argparse.ArgumentTypeError(why)
    return text


path = _typed(path, "path")


def storage_url(text: str) -> str:
    """An Optuna storage URL SQLAlchemy reads, naming what SQLite would open (autotune.store.storage_url)."""
    from autotune.fileio.writing import name_problem
    from autotune.store.storage_url import StorageUrlError, parse, safe_url

    if not str(text).strip():
        raise argparse.ArgumentTypeError("must name a path, got ''")
    try:
        target = parse(text)
    except StorageUrlError as e:
        raise argparse.ArgumentTypeError(f"{safe_url(text)} {e}") from None
    why = target.file is not None and name_problem(target.file)
    if why:
        raise argparse.ArgumentTypeError(f"{safe_url(text)}: the SQLite file {why}")
    return text


storage_url = _typed(storage_url, "storage")


def shell_words(text: str) -> tuple[str, ...]:
    """Arguments written as a shell would split them (`--server-args="--mem-fraction-static 0.85"`)."""
    try:
        return tuple(shlex.split(text))
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"is not a list of arguments ({str(e).lower()}): {text!r}") from None


shell_words = _typed(shell_words, "arguments")


def executable(text: str) -> str:
    """A program that can be started: a path to an executable file, or a name on PATH."""
    found = shutil.which(text) if os.sep not in text else text
    if not found or not os.path.isfile(found) or not os.access(found, os.X_OK):
        raise argparse.ArgumentTypeError(f"must name an executable (a path, or a name on PATH), got {text!r}")
    return text


executable = _typed(executable, "executable")


class DistinctPaths(argparse.Action):
    """A list of files or folders, each named once (the same one twice, however spelled, was read twice
    in silence)."""

    def __call__(self, parser, namespace, values, option_string=None):
        seen: dict = {}
        for v in values:
            where = os.path.realpath(v)
            if where in seen:
                raise argparse.ArgumentError(self, f"names {seen[where]!r} twice ({v!r} is the same): name each once")
            seen[where] = v
        setattr(namespace, self.dest, values)


def add_force(p: argparse.ArgumentParser) -> None:
    """--force, the same flag on every command that writes files."""
    p.add_argument("--force", action="store_true",
                   help="replace files autotune did not write where it writes its own (refused without it)")


def cache_folders_problem() -> str | None:
    """The folders torch, Triton and SGLang create their caches in at import (~/.cache, ~/.triton or
    what their variables name): a file where one must go is said in one line before any import
    (HOME naming a file was a NotADirectoryError from inside torch)."""
    home = os.path.expanduser("~")
    for var, default in (("XDG_CACHE_HOME", os.path.join(home, ".cache")),
                         ("TRITON_CACHE_DIR", os.path.join(home, ".triton", "cache"))):
        folder = os.environ.get(var) or default
        p = os.path.abspath(folder)
        while not os.path.lexists(p) and os.path.dirname(p) != p:
            p = os.path.dirname(p)
        if os.path.exists(p) and not os.path.isdir(p):
            named = f"{var}={folder}" if os.environ.get(var) else f"HOME={home}"
            return (f"{named}: {p} is a file, and torch, Triton and SGLang keep their caches in {folder}: "
                    f"point {var if os.environ.get(var) else 'HOME'} at a folder")
    return None

