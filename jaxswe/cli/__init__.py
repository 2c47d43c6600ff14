"""The `jaxswe` command line: every command in one module of this package.

Each module registers its subcommands through a `register(app)` function listed in
`_COMMAND_MODULES` (imported when the app is built); this file assembles them, answers
`--version`, and turns user and usage errors into one line + exit 2.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import importlib
import os
import shlex
import signal
import sys
import threading
import warnings
from typing import Annotated

import typer

from jaxswe import __version__
from jaxswe.errors import UserError

# transformers' "PyTorch was not found" advice: jaxswe needs only its tokenizers and configs
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

# Modules that define `register(app: typer.Typer) -> None`.
_COMMAND_MODULES: list[str] = [
    "jaxswe.cli.serve",
    "jaxswe.cli.tasks",
    "jaxswe.cli.stages",
    "jaxswe.cli.convert",
    "jaxswe.cli.export",
    "jaxswe.cli.plan",
    "jaxswe.cli.sandboxes",
    "jaxswe.cli.inspect",
]

app = typer.Typer(
    name="jaxswe",
    help="Train long-context multi-turn SWE agents: RFT, then DAPO RL (arXiv 2508.03501).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode=None,
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"jaxswe {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_print_version, is_eager=True, help="print the version")
    ] = False,
) -> None:
    """Train long-context multi-turn SWE agents: RFT, then DAPO RL (arXiv 2508.03501)."""


def _user_error_types() -> tuple[type[BaseException], ...]:
    types: list[type[BaseException]] = [UserError]
    try:
        from envs.errors import EnvError

        types.append(EnvError)
    except ImportError:
        pass
    return tuple(types)


def _click_error_types() -> tuple[type[BaseException], ...]:
    """ClickException of the click that typer parses with (typer >= 0.17 bundles its own) and of click."""
    types = []
    for module in ("typer._click.exceptions", "click.exceptions"):
        with contextlib.suppress(ImportError):
            types.append(importlib.import_module(module).ClickException)
    return tuple(types)


def _usage_line(err: BaseException) -> str:
    """A click usage error as one line: the command, the message, where help is."""
    ctx = getattr(err, "ctx", None)
    command = ctx.command_path if ctx is not None else "jaxswe"
    return f"jaxswe: error: {err.format_message()} (see '{command} --help')"


def build_app() -> typer.Typer:
    for name in _COMMAND_MODULES:
        importlib.import_module(name).register(app)
    return app


_STAGE_COMMANDS = ("rft", "rl", "eval", "pipeline")


def _resume_hint(args: list[str]) -> str:
    if not args or args[0] not in _STAGE_COMMANDS or "--run-dir" not in args:
        return ""
    again = args if "--resume" in args else [*args, "--resume"]
    return f"; continue with: jaxswe {shlex.join(again)}"


def _first_sigint(signum: int, frame: object) -> None:
    """Ctrl-C: KeyboardInterrupt, so the stage stops and writes what it has; the next one exits.
    While one of jaxswe's episode loops runs (jaxswe.run.loops), the loop's tasks are cancelled and
    its runner raises it: raised inside one episode's coroutine it would end that episode alone, and
    the loop's exit would then shut the episodes' thread pool under the others (their environments
    left unclosed). In a library's loop (orbax's, writing a checkpoint) it is raised where it lands."""
    from jaxswe.run import loops

    signal.signal(signal.SIGINT, _second_sigint)
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # no loop: here and now
        raise KeyboardInterrupt from None
    if not loops.is_ours(loop):  # a library's loop (orbax writing a checkpoint): here and now
        raise KeyboardInterrupt
    loop.call_soon_threadsafe(loops.interrupt, loop)


def _second_sigint(signum: int, frame: object) -> None:
    print("jaxswe: interrupted again: exiting now", file=sys.stderr, flush=True)
    os._exit(130)


@contextlib.contextmanager
def _sigint_handlers():
    """While a command runs: the second Ctrl-C exits at once, whatever the first one's cleanup (or
    the interpreter's exit after it) is doing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGINT, _first_sigint)
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGINT) is _first_sigint:  # not interrupted: as it was
            signal.signal(signal.SIGINT, before)


def _each_warning_once() -> None:
    """Print each warning (category and text) once per process. Python's own once-per-place
    registry is cleared whenever any library touches the warning filters (`catch_warnings`), so
    without this JAX's `os.fork()` warning prints again at nearly every sandbox command."""
    show, shown = warnings.showwarning, set()

    def showwarning(message, category, filename, lineno, file=None, line=None):
        key = (category, str(message))
        if key not in shown:
            shown.add(key)
            show(message, category, filename, lineno, file, line)

    warnings.showwarning = showwarning


def main(argv: list[str] | None = None) -> None:
    """Entry point of the console script and `python -m jaxswe`."""
    args = list(sys.argv[1:] if argv is None else argv)
    if argv is None:  # the process is jaxswe's (a caller's own warnings setup stays as it is)
        _each_warning_once()
        # `kill -USR1 PID` prints every thread's stack to stderr: where a run that seems hung waits
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    build_app()
    try:
        with _sigint_handlers():
            code = app(args=args, prog_name="jaxswe", standalone_mode=False)  # typer.Exit(n) comes back as n
    except _user_error_types() as err:
        print(f"jaxswe: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    except (typer.Abort, KeyboardInterrupt):
        code = 130
    except _click_error_types() as err:
        if type(err).__name__ == "NoArgsIsHelpError":  # `jaxswe` or `jaxswe tasks` alone: the help
            err.show()
        else:
            print(_usage_line(err), file=sys.stderr)
        raise SystemExit(2) from None
    if code == 130:  # Ctrl-C (typer turns KeyboardInterrupt into exit code 130): the stage stopped cleanly
        print(f"jaxswe: interrupted{_resume_hint(args)}", file=sys.stderr)
    if isinstance(code, int) and code:
        raise SystemExit(code)
