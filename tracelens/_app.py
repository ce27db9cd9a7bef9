"""The Typer app every command registers on (`tracelens.cli` imports the commands; they import this).

Exit codes: 0 success, 1 regression found (`check`), 2 bad input (any TracelensError).
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import traceback

import typer
import typer.main

from tracelens._version import __version__
from tracelens.errors import TracelensError

try:  # Typer >= 0.22 carries its own copy of click
    from typer import _click as click
except ImportError:  # pragma: no cover - older Typer on the click package
    import click  # type: ignore[no-redef]


def _plain_flags(command, help_names: list[str]) -> None:
    """On/off flags (`--force`, `-h`) take no value: an empty metavar, so that the help shows no `<bool>`
    after them (Typer's rich help prints the type of every option, flags included). Sub-commands too; the
    help option, which click makes on first use and keeps, is made here."""
    params = list(getattr(command, "params", []))
    try:
        ctx = click.Context(command, info_name=command.name, help_option_names=help_names)
        helper = command.get_help_option(ctx)
        if helper is not None:
            params.append(helper)
    except Exception:  # pragma: no cover - a click without a kept help option: it keeps its metavar
        pass
    for param in params:
        if getattr(param, "is_flag", False) and getattr(param, "metavar", None) is None:
            param.metavar = ""
    for sub in getattr(command, "commands", {}).values():
        _plain_flags(sub, help_names)


def usage_error_line(err) -> str:
    """One line for a command-line usage error (unknown or mistyped flag, missing argument, bad value), with
    where to read the usage: `tracelens: error: No such option: --forse (Possible options: --force, --ops,
    --order); see tracelens analyze -h`."""
    message = " ".join(str(err.format_message()).split())
    ctx = getattr(err, "ctx", None)
    where = f"; see {ctx.command_path} -h" if ctx is not None and getattr(ctx, "command_path", None) else ""
    return f"tracelens: error: {message.rstrip('.')}{where}"


class _App(typer.Typer):
    """Typer app that turns TracelensError into a one-line message and exit code 2, and so a usage error
    (click's, printed by Typer as a box of several lines) too."""

    def __call__(self, *args, **kwargs):
        debug = "--debug" in sys.argv[1:] or os.environ.get("TRACELENS_DEBUG") == "1"
        if "--debug" in sys.argv[1:]:
            sys.argv.remove("--debug")
            os.environ["TRACELENS_DEBUG"] = "1"
        try:
            return self._run(*args, **kwargs)
        except TracelensError as err:
            if debug:
                traceback.print_exc()
            typer.echo(f"tracelens: error: {err}", err=True)
            sys.exit(err.exit_code)
        except KeyboardInterrupt:
            typer.echo("tracelens: interrupted", err=True)
            sys.exit(130)
        except SystemExit:
            raise
        except Exception as err:  # a bug, not a user error: say so in one line, traceback with --debug
            if isinstance(err, OSError) and err.filename and not debug:
                # a path that cannot be read or written (permissions, a special file): the user's to fix
                typer.echo(f"tracelens: error: {err.filename}: {err.strerror or err}", err=True)
                sys.exit(2)
            if debug:
                traceback.print_exc()
            else:
                typer.echo(
                    f"tracelens: internal error: {type(err).__name__}: {err} (rerun with --debug for a traceback)",
                    err=True,
                )
            sys.exit(3)

    def _run(self, *args, **kwargs):
        """The command line, click's errors handled here (`standalone_mode=False`): the exit code of
        `typer.Exit` (help, --version, `check`'s 1) or 0."""
        command = typer.main.get_command(self)
        _plain_flags(command, HELP_NAMES)
        try:
            code = command.main(*args, **{**kwargs, "standalone_mode": False})
        except click.exceptions.NoArgsIsHelpError:
            sys.exit(2)  # (Typer printed the help already)
        except click.exceptions.ClickException as err:
            typer.echo(usage_error_line(err), err=True)
            sys.exit(err.exit_code)
        except typer.Abort:
            typer.echo("tracelens: aborted", err=True)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) and not isinstance(code, bool) else 0)


HELP_NAMES = ["-h", "--help"]
app = _App(
    name="tracelens",
    help="Why is my multi-GPU training run slow? Analyze PyTorch profiler and NCCL traces.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": HELP_NAMES},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"tracelens {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Show the version."
    ),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks for errors."),
) -> None:
    """tracelens: per-rank and per-stage analysis of multi-GPU training traces."""


def main() -> None:
    """The `tracelens` command (console script and `python -m tracelens`): `app()`, then a fast exit.

    A finished command leaves the analysis it made alive (at 1,024 ranks ~0.8 GB of tables, arrays and
    memory-mapped files); tearing that down object by object at interpreter exit takes ~0.16 s
    there. So once the command has returned an exit code, the output streams are flushed and the
    `atexit` callbacks run (temporary folders, logging, finalizers registered to run at exit), and the
    process ends with `os._exit`: the kernel releases the memory at once. When a thread other than a
    daemon one is still running, a profiler or tracer is attached, or the code is not a number, Python's
    normal exit is kept. Embedded use
    (`app()` itself, tests) never takes this path."""
    try:
        app()
    except SystemExit as stop:
        code = stop.code
        if code is not None and not isinstance(code, int):
            raise
        main_thread = threading.main_thread()
        if any(t is not main_thread and not t.daemon and t.is_alive() for t in threading.enumerate()):
            raise  # (a thread still working: Python's exit waits for it)
        if _observed():
            raise  # (a profiler or tracer that reports after the program: `python -m cProfile -o ...`)
        _fast_exit(code or 0)


def _observed() -> bool:
    """A profiler or tracer is attached (sys.setprofile / settrace, or a sys.monitoring tool on Python
    3.12+, as cProfile and coverage use there): it may write its results after the program returns."""
    if sys.getprofile() is not None or sys.gettrace() is not None:
        return True
    mon = getattr(sys, "monitoring", None)
    return mon is not None and any(mon.get_tool(i) is not None for i in range(6))


def _fast_exit(code: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (`tracelens ... | head`) or a closed stream
            code = code or 1
    atexit._run_exitfuncs()
    os._exit(code)
