"""The ``kvwatch`` command line: registers each command and maps errors to exit codes.

Commands live in ``kvwatch.commands``; each is a plain function whose annotations typer reads,
and ends with ``raise typer.Exit(code)`` when the code is not 0.
Exit codes (CONTRACTS.md): 0 success, 1 input read but unusable, 2 usage error. Bad input never
prints a traceback: commands raise ``kvwatch.errors.KvwatchError`` with a one-line message.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType

import typer

from kvwatch.errors import KvwatchError

app = typer.Typer(
    name="kvwatch",
    help="Observability for vLLM's KV cache: capacity, memory-bound saturation, preemptions.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


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


def _analyze_only() -> typer.Typer:
    """``kvwatch analyze`` alone: the watch and snapshot modules (pydantic, requests,
    prometheus_client) cost 0.25 s of start-up, a fifth of analyzing a 400 MB log."""
    from kvwatch.commands import analyze

    single = typer.Typer(name="kvwatch", add_completion=False, pretty_exceptions_enable=False)
    single.callback()(lambda: None)  # a group, as with every command: `kvwatch analyze PATH`
    single.command("analyze")(analyze.analyze)
    return single


def _one_line_usage_error(exc: Exception) -> None:
    """typer prints usage errors as a multi-line rich panel; CONTRACTS.md wants one line on stderr."""
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


# typer calls rich_utils.rich_format_error for usage errors (bad flag, missing value, bad choice).
_rich_utils = sys.modules.get("typer.rich_utils") or _lazy_rich_utils()
_rich_utils.rich_format_error = _one_line_usage_error  # type: ignore[attr-defined]


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point.

    typer's standalone mode handles usage errors (exit 2 with a one-line message) and
    ``typer.Exit``; kvwatch's own errors are turned into one line here.
    """
    args = sys.argv[1:] if argv is None else argv
    try:
        if args[:1] == ["analyze"]:
            _analyze_only()(args=args, prog_name="kvwatch")
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
