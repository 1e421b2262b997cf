"""The ``kvwatch`` command line: registers each command and maps errors to exit codes.

Commands live in ``kvwatch.commands``; each is a plain function whose annotations typer reads,
and ends with ``raise typer.Exit(code)`` when the code is not 0.
Exit codes (docs/contracts.md): 0 success, 1 input read but unusable, 2 usage error. Bad input never
prints a traceback: commands raise ``kvwatch.errors.KvwatchError`` with a one-line message.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.util
import sys
from types import ModuleType

import typer

from kvwatch import cli_coercion
from kvwatch.errors import KvwatchError

cli_coercion.install()  # plain option values coerced without importing pydantic (start-up time)

app = typer.Typer(
    name="kvwatch",
    help="Observability for vLLM's KV cache: capacity, memory-bound saturation, preemptions.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    # click's own help layout: it wraps the help text to the terminal and never cuts an option
    # name, where rich's option table cut "--gpu-memory-utilization" to "--gpu-memory-utili…" at
    # 80 columns.
    rich_markup_mode=None,
)


def _print_version(value: bool) -> None:
    """``kvwatch --version``: the version, which log scanner this install runs (see
    kvwatch.sources.scanner: the compiled one, or the pure-Python fallback) and which inflater
    reads .gz logs (kvwatch.sources.inflate: ISA-L, or zlib)."""
    if not value:
        return
    from kvwatch import __version__
    from kvwatch.sources import inflate, scanner

    print(f"kvwatch {__version__} (log scanner: {scanner.name()}; gzip: {inflate.name()})")
    raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False,
        "--version",
        callback=_print_version,
        is_eager=True,
        help="Print the version, the log scanner and the gzip inflater.",
    ),
) -> None:
    pass


def _register_all() -> None:
    if app.registered_commands:
        return
    from kvwatch.commands import analyze, capacity, simulate, snapshot, watch

    app.command("analyze")(analyze.analyze)
    app.command("snapshot")(snapshot.snapshot)
    app.command("capacity")(capacity.capacity)
    app.command("fleet")(capacity.fleet)
    app.command("watch")(watch.watch)
    app.command("simulate")(simulate.simulate_command)
    app.command("run", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(watch.run)


# Each command, by the module and function that implement it, so that `kvwatch CMD` imports only
# CMD's module: importing all of them (watch's pydantic settings, snapshot's prometheus_client and
# requests, capacity's catalogue) cost 0.2-0.3 s of every start-up. Every command of
# _register_all has its row here (tests/test_cli_startup.py checks it).
_LAZY: dict[str, tuple[str, str, dict[str, bool] | None]] = {
    "analyze": ("analyze", "analyze", None),
    "snapshot": ("snapshot", "snapshot", None),
    "capacity": ("capacity", "capacity", None),
    "fleet": ("capacity", "fleet", None),
    "watch": ("watch", "watch", None),
    "simulate": ("simulate", "simulate_command", None),
    "run": ("watch", "run", {"allow_extra_args": True, "ignore_unknown_options": True}),
}


def _single(name: str) -> typer.Typer:
    """``kvwatch NAME`` with only NAME's module imported."""
    module, attr, settings = _LAZY[name]
    func = getattr(importlib.import_module(f"kvwatch.commands.{module}"), attr)
    single = typer.Typer(name="kvwatch", add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)
    single.callback()(lambda: None)  # a group, as with every command: `kvwatch analyze PATH`
    single.command(name, context_settings=settings)(func)
    return single


def _analyze_only() -> typer.Typer:
    """``kvwatch analyze`` alone (see _single)."""
    return _single("analyze")


def _summary(module: str, attr: str) -> str:
    """The docstring of ``kvwatch.commands.<module>.<attr>``, read from its source without importing it."""
    spec = importlib.util.find_spec(f"kvwatch.commands.{module}")
    origin = spec.origin if spec is not None else None
    if origin is None:
        return ""
    with open(origin, encoding="utf-8") as fh:
        source = fh.read()
    # Parsing a whole command module cost ~5 ms each, most of `kvwatch --help`: parse only from
    # `def attr(` to the next top-level def, class or decorator (a complete run of statements),
    # and the whole module when that slice does not hold the function (the same node either way).
    start = source.find(f"\ndef {attr}(")
    if start >= 0:
        ends = [source.find(f"\n{kw}", start + 1) for kw in ("def ", "async def ", "class ", "@")]
        end = min((e for e in ends if e >= 0), default=len(source))
        with contextlib.suppress(SyntaxError):
            found = _docstring_of(ast.parse(source[start:end]), attr)
            if found is not None:
                return found
    return _docstring_of(ast.parse(source), attr) or ""


def _docstring_of(tree: ast.Module, attr: str) -> str | None:
    """The docstring of the top-level function ``attr`` in ``tree`` ("" without one); None when absent."""
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == attr:
            return ast.get_docstring(node) or ""
    return None


def _overview() -> typer.Typer:
    """``kvwatch --help`` (and ``--version``, no command): the command list as typer prints it, each
    command's help from its docstring, no command module imported."""
    if not app.registered_commands:  # the real commands, if _register_all ran, serve as well
        for name, (module, attr, settings) in _LAZY.items():
            app.command(name, help=_summary(module, attr), context_settings=settings)(lambda: None)
    return app


def _one_line_usage_error(exc: Exception) -> None:
    """typer prints usage errors as a multi-line rich panel; docs/contracts.md wants one line on stderr."""
    ctx = getattr(exc, "ctx", None)
    where = getattr(ctx, "command_path", "kvwatch")
    message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
    print(f"{where}: error: {' '.join(message.split())} (see {where} --help)", file=sys.stderr)


def _lazy_rich_utils() -> ModuleType:
    """typer.rich_utils, loaded on first use: importing it (rich, markdown_it) costs 75 ms of every
    start-up, and typer needs it only to print help or an error. Attributes set before the load
    survive it (importlib.util.LazyLoader)."""
    spec = importlib.util.find_spec("typer.rich_utils")
    if spec is None or spec.loader is None:  # not expected: typer ships it
        return importlib.import_module("typer.rich_utils")
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["typer.rich_utils"] = module
    loader.exec_module(module)
    typer.rich_utils = module  # type: ignore[attr-defined]
    return module


# typer calls rich_utils.rich_format_error for usage errors (bad flag, missing value, bad choice)
# when rich formats its output, and the exception's show() when click does (rich_markup_mode=None,
# kvwatch's setting): both print one line.
_rich_utils = sys.modules.get("typer.rich_utils") or _lazy_rich_utils()
_rich_utils.rich_format_error = _one_line_usage_error  # type: ignore[attr-defined]
_click_exceptions = importlib.import_module("typer._click.exceptions")
for _kind in (_click_exceptions.ClickException, _click_exceptions.UsageError):
    _kind.show = lambda self, file=None: _one_line_usage_error(self)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point.

    typer's standalone mode handles usage errors (exit 2 with a one-line message) and
    ``typer.Exit``; kvwatch's own errors are turned into one line here.
    """
    args = sys.argv[1:] if argv is None else argv
    try:
        if args[:1] and args[0] in _LAZY:
            _single(args[0])(args=args, prog_name="kvwatch")
        elif not args or args[0].startswith("-"):
            _overview()(args=args, prog_name="kvwatch")
        else:
            _register_all()
            app(args=args, prog_name="kvwatch")
    except KvwatchError as exc:
        print(f"kvwatch: error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except BrokenPipeError:  # `kvwatch analyze ... | head`
        sys.stderr.close()
        sys.exit(0)
    except KeyboardInterrupt:
        sys.exit(130)
