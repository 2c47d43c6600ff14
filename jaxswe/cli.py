"""The `jaxswe` command line.

Each feature module registers its own subcommands through a `register(app)` function listed in
`_COMMAND_MODULES`; this file only assembles them and turns user errors into one line + exit 2.
"""

from __future__ import annotations

import importlib
import sys

import typer

from jaxswe.errors import UserError

# Modules that define `register(app: typer.Typer) -> None`.
_COMMAND_MODULES: list[str] = [
    "jaxswe.rollout.cli",
    "jaxswe.tasks_cli",
    "jaxswe.stages.cli",
    "jaxswe.model.cli",
    "jaxswe.plan",
    "jaxswe.sandboxes_cli",
]

app = typer.Typer(
    name="jaxswe",
    help="Train long-context multi-turn SWE agents: RFT, then synchronous DAPO RL (arXiv 2508.03501).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _user_error_types() -> tuple[type[BaseException], ...]:
    types: list[type[BaseException]] = [UserError]
    try:
        from envs.errors import EnvError

        types.append(EnvError)
    except ImportError:
        pass
    return tuple(types)


def build_app() -> typer.Typer:
    for name in _COMMAND_MODULES:
        importlib.import_module(name).register(app)
    return app


def main(argv: list[str] | None = None) -> None:
    """Entry point of the console script and `python -m jaxswe`."""
    build_app()
    try:
        code = app(args=argv, standalone_mode=False)  # typer.Exit(n) comes back as n here
    except _user_error_types() as err:
        print(f"jaxswe: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    except typer.Abort:
        print("jaxswe: aborted", file=sys.stderr)
        raise SystemExit(130) from None
    except Exception as err:  # click usage errors arrive as ClickException
        import click

        if isinstance(err, click.ClickException):
            err.show()
            raise SystemExit(err.exit_code) from None
        raise
    if isinstance(code, int) and code:
        raise SystemExit(code)
