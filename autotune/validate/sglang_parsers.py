"""SGLang's own argument parsers, to check our command lines before anything starts.

Where SGLang's benchmark modules do not import (the CPU test environment: `sglang.benchmark.serving`
pulls in `datasets` and the quantization stack), their parser-building function is executed from
the installed module's source text (`sglang_parser`)."""
from __future__ import annotations

import argparse
import ast
import builtins
import importlib
import importlib.util
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from autotune.validate import CommandError
from autotune.validate.sglang_commands import ONE_BATCH_MODULE, SERVER_MODULE, SERVING_MODULE


# --- SGLang's own parsers ---------------------------------------------------------------------

class _Captured(Exception):
    def __init__(self, parser, argv):
        super().__init__("parser captured")
        self.parser, self.argv = parser, argv


def _capture_parser(entry, *args):
    """Run an SGLang CLI entry point until it calls `parse_args`; return (parser, argv it passed)."""
    real = argparse.ArgumentParser.parse_args

    def capture(self, args=None, namespace=None):
        raise _Captured(self, args)

    argparse.ArgumentParser.parse_args = capture
    try:
        entry(*args)
    except _Captured as c:
        return c.parser, c.argv
    finally:
        argparse.ArgumentParser.parse_args = real
    raise CommandError(f"{entry!r} returned without parsing arguments")


@dataclass
class SourceNamespace:
    """Definitions of a module executed from its source text (names it could not define are
    placeholders, listed in `missing`)."""
    namespace: dict
    missing: list = field(default_factory=list)


class _Missing:
    def __init__(self, name, why=""):
        self.name, self.why = name, why

    def __repr__(self):
        return f"<not loaded from source: {self.name}{': ' + self.why if self.why else ''}>"


def _names(nodes) -> set[str]:
    out = set()
    for n in nodes:
        if n is None:
            continue
        for sub in ast.walk(n):
            if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load):
                out.add(sub.id)
    return out


def _definition_names(node) -> set[str]:
    """Names a top-level statement evaluates when it is executed (function annotations excluded:
    the statements are compiled with postponed annotations; class field annotations included)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return _names(node.decorator_list + node.args.defaults + [d for d in node.args.kw_defaults if d])
    if isinstance(node, ast.ClassDef):
        out = _names(node.bases + [k.value for k in node.keywords] + node.decorator_list)
        for stmt in node.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out |= _definition_names(stmt)
            elif isinstance(stmt, ast.AnnAssign):
                # field annotations too: pydantic resolves them in the module's namespace
                out |= _names([stmt.value, stmt.annotation])
            else:
                out |= _names([stmt])
        return out
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        return _names([node.value])
    return set()


def _body_names(node) -> set[str]:
    """Global names a function (or a class's methods) reads when called: names read in the body
    that the body does not bind itself (arguments, assignments, loop and comprehension targets)."""
    funcs = []
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        funcs = [node]
    elif isinstance(node, ast.ClassDef):
        funcs = [s for s in node.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))]
    out = set()
    for f in funcs:
        local = {a.arg for a in ast.walk(f.args) if isinstance(a, ast.arg)}
        for sub in ast.walk(f):
            if isinstance(sub, ast.Name) and isinstance(sub.ctx, (ast.Store, ast.Del)):
                local.add(sub.id)
            elif isinstance(sub, (ast.Import, ast.ImportFrom)):
                local |= {a.asname or a.name.split(".")[0] for a in sub.names}
            elif isinstance(sub, ast.ExceptHandler) and sub.name:
                local.add(sub.name)
        out |= _names(f.body) - local
    return out


def load_from_source(module_name: str, entry: str) -> SourceNamespace:
    """Execute `entry` (a function of `module_name`) and what it needs from the module's source
    text: the definitions it reads when called, and, one level down, what the functions and
    classes it names read; imports are performed one name at a time. Everything is the
    installed module's own code; nothing is copied. A name whose definition cannot be executed
    (an import that fails here) becomes a placeholder listed in `missing`."""
    import __future__

    spec = importlib.util.find_spec(module_name)
    if spec is None or not spec.origin:
        raise CommandError(f"{module_name} is not installed")
    source = Path(spec.origin).read_text()
    tree = ast.parse(source)
    defs: dict[str, ast.stmt] = {}

    def collect(stmts):
        for node in stmts:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defs.setdefault(node.name, node)
            elif isinstance(node, ast.Assign):
                for t in node.targets:
                    if isinstance(t, ast.Name):
                        defs.setdefault(t.id, node)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value:
                defs.setdefault(node.target.id, node)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    name = alias.asname or alias.name.split(".")[0]
                    one = (ast.Import(names=[alias]) if isinstance(node, ast.Import)
                           else ast.ImportFrom(module=node.module, names=[alias], level=node.level))
                    defs.setdefault(name, ast.copy_location(one, node))
            elif isinstance(node, ast.Try):
                collect(node.body)
            elif isinstance(node, ast.If) and not _is_main_guard(node):
                collect(node.body)

    collect(tree.body)
    # A real module object (dataclasses and pydantic look classes' modules up in sys.modules),
    # under a private name so the failed import of the real module is not shadowed.
    import types
    mod_name = "_autotune_sglang_source." + module_name
    module = types.ModuleType(mod_name)
    module.__file__ = spec.origin
    sys.modules[mod_name] = module
    ns = module.__dict__
    out = SourceNamespace(ns)
    busy: set[str] = set()
    flags = __future__.annotations.compiler_flag

    def resolve(name: str, deep: bool) -> None:
        if name in ns or name in busy or (name not in defs and hasattr(builtins, name)):
            return
        node = defs.get(name)
        if node is None:
            ns[name] = _Missing(name)
            out.missing.append(name)
            return
        busy.add(name)
        try:
            for n in _definition_names(node) | (_body_names(node) if deep else set()):
                resolve(n, False)
            tree1 = ast.fix_missing_locations(ast.Module(body=[node], type_ignores=[]))
            exec(compile(tree1, spec.origin, "exec", flags=flags, dont_inherit=True), ns)
        except Exception as e:              # an import this machine lacks, mostly
            ns[name] = _Missing(name, f"{type(e).__name__}: {e}")
            out.missing.append(name)
        finally:
            busy.discard(name)

    entry_node = defs.get(entry)
    if entry_node is None:
        raise CommandError(f"{module_name} has no {entry}() in {spec.origin}")
    for n in _body_names(entry_node):
        node = defs.get(n)
        resolve(n, isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)))
    resolve(entry, False)
    return out


def _is_main_guard(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Compare) and isinstance(t.left, ast.Name) and t.left.id == "__name__")


@dataclass
class SglangParser:
    module: str
    parser: argparse.ArgumentParser
    how: str                        # "imported" or "source text of <file> (<why the import failed>)"
    transform: object = None        # argv -> argv SGLang applies before parsing (--config merge)

    def parse(self, argv: list[str]) -> argparse.Namespace:
        if self.transform:
            argv = self.transform(list(argv))
        saved = sys.stderr
        import io
        err = io.StringIO()
        sys.stderr = err
        try:
            return self.parser.parse_args(argv)
        except SystemExit:
            raise CommandError(f"SGLang's parser for {self.module} refuses {shlex.join(argv)}: "
                               + err.getvalue().strip().splitlines()[-1]) from None
        finally:
            sys.stderr = saved


_PARSERS: dict[str, SglangParser] = {}


def sglang_parser(module: str) -> SglangParser:
    """SGLang's own argument parser of `module` (launch_server, benchmark.serving,
    benchmark.one_batch_server), built by SGLang's code: imported where the module imports,
    else its CLI function executed from the installed source text."""
    if module in _PARSERS:
        return _PARSERS[module]
    if module == SERVER_MODULE:
        from autotune.adapters.sglang_server import server_args_preparer

        prepare_server_args = server_args_preparer()

        def transform(argv):
            return _capture_parser(prepare_server_args, argv)[1]

        parser, _ = _capture_parser(prepare_server_args, ["--model-path", "x"])
        sp = SglangParser(module, parser, "imported (sglang.srt.server_args.prepare_server_args)", transform)
    elif module in (SERVING_MODULE, ONE_BATCH_MODULE):
        try:
            mod = importlib.import_module(module)
            parser, _ = _capture_parser(mod.cli_main)
            sp = SglangParser(module, parser, "imported")
        except ImportError as e:
            src = load_from_source(module, "cli_main")
            entry = src.namespace.get("cli_main")
            if not callable(entry):
                raise CommandError(f"cannot build {module}'s parser from its source: {entry!r}") from None
            try:
                parser, _ = _capture_parser(entry)
            except CommandError:
                raise
            except Exception as e2:
                raise CommandError(f"cannot build {module}'s parser from its source: "
                                   f"{type(e2).__name__}: {e2}") from None
            origin = importlib.util.find_spec(module).origin
            sp = SglangParser(module, parser, f"source text of {origin} (the module does not import here: {e})")
    else:
        raise CommandError(f"no SGLang parser known for {module}")
    _PARSERS[module] = sp
    return sp


def parse_command(cmd: list[str]) -> argparse.Namespace:
    """Parse one of our command lines ([python, -m, module, args...]) with SGLang's parser."""
    if len(cmd) < 3 or cmd[1] != "-m":
        raise CommandError(f"not a `python -m module` command: {shlex.join(cmd)}")
    return sglang_parser(cmd[2]).parse(cmd[3:])
