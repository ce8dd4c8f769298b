"""The ``kith`` command: one dispatcher that maps :class:`node.common.errors.KithError` to a
message on stderr (or a JSON error object in ``--json`` mode) and an exit code
(0 ok, 1 failure, 2 usage; DESIGN §13). ``--debug`` shows tracebacks instead.
"""

from __future__ import annotations

import json
import sys
from typing import Optional

import typer
from rich.markup import escape

from node.cli.common import err_console, safe_text, state_of
from node.common.errors import ConfigError, KithError

app = typer.Typer(
    name="kith",
    help=(
        "Kith: share what you know, peer to peer. A Host indexes a local folder and "
        "publishes a signed invitation; a Guest joins it by post_id over iroh QUIC and "
        "asks questions; an egress policy decides what may leave the Host's machine."
    ),
    no_args_is_help=True,
    # help text is printed as written: no rich markup (`.[hybrid]` keeps its
    # brackets), no panels or colour, so `--help` reads the same in a pipe (issue 12)
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def version_text() -> str:
    """``kith <version> (Python <version>)``: the installed kith-node's version."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        ver = version("kith-node")
    except PackageNotFoundError:  # pragma: no cover - run from a checkout without install
        ver = "unknown (not installed)"
    return f"kith {ver} (Python {sys.version.split()[0]})"


def _print_version(value: bool) -> None:
    if value:
        sys.stdout.write(version_text() + "\n")
        raise typer.Exit(0)


@app.callback()
def _root(
    ctx: typer.Context,
    home: Optional[str] = typer.Option(
        None, "--home", envvar="KITH_HOME", metavar="DIR",
        help="Node home (identity, corpus, policy). Default: $KITH_HOME or the platform data dir.",
    ),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks for errors."),
    _version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version,
                                  help="Print the version and exit."),
) -> None:
    st = state_of(ctx)
    st.home_arg = home
    st.debug = debug


_REGISTERED = False


def _register() -> None:
    """Attach every sub-command module (each owns its own Typer app or commands); once per
    process (:func:`main` may run several times in one process, e.g. in tests)."""
    global _REGISTERED
    if _REGISTERED:
        return
    _REGISTERED = True
    from node.cli import commands  # noqa: F401  (registers init/host/join/protocol)

    for modname, attr, name in (
        ("node.cli.index_cmd", "index_app", "index"),
        ("node.cli.policy_cmd", "policy_app", "policy"),
        ("node.cli.peers_cmd", "peers_app", "peers"),
        ("node.cli.approvals_cmd", "approvals_app", "approvals"),
        ("node.cli.community_cmd", "community_app", "community"),
        ("node.cli.api_cmd", "api_app", "api"),
        ("node.cli.status_cmd", "sessions_app", "sessions"),
    ):
        try:
            mod = __import__(modname, fromlist=[attr])
        except ModuleNotFoundError as exc:
            if exc.name != modname:
                raise
            continue
        app.add_typer(getattr(mod, attr), name=name)
    try:
        from node.cli.index_cmd import search_cmd
    except ImportError:
        pass
    else:
        app.command("search")(search_cmd)
    from node.cli.browse_cmd import browse_cmd, feedback_cmd

    app.command("browse")(browse_cmd)
    app.command("feedback")(feedback_cmd)
    from node.cli.api_cmd import mcp_cmd

    app.command("mcp")(mcp_cmd)
    from node.cli.audit_cmd import audit_cmd

    app.command("audit")(audit_cmd)
    from node.cli.status_cmd import status_cmd

    app.command("status")(status_cmd)
    from node.cli.ask_cmd import ask_cmd

    app.command("ask")(ask_cmd)
    from node.cli.dashboard_cmd import dashboard_cmd

    app.command("dashboard")(dashboard_cmd)


def _wants_json(argv: list[str]) -> bool:
    return "--json" in argv


def _as_kith_error(exc: BaseException) -> KithError | None:
    """The refusal to report for ``exc``: a KithError itself, the first KithError inside an
    exception group (anyio task groups wrap what a task raised), or a local I/O failure
    (read-only home, permission denied) as ``io-error``. None: not ours — re-raise."""
    if isinstance(exc, KithError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _as_kith_error(inner)
            if found is not None:
                return found
        return None
    if isinstance(exc, OSError):
        where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
        return ConfigError("io-error", f"{exc.strerror or type(exc).__name__}{where}",
                           hint="check that the Kith home and the files named are writable by you")
    import sqlite3

    if isinstance(exc, sqlite3.OperationalError) and "readonly" in str(exc):
        return ConfigError("io-error", "the database in the Kith home is read-only",
                           hint="check that the Kith home is writable by you")
    return None


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: run the CLI and exit with its status.

    Usage errors and ``--help`` are handled by the CLI library (exit 2 / 0); a
    :class:`KithError` (also when raised inside a task group, or a local I/O failure mapped
    to ``io-error``) prints ``error [code]: message`` (and a hint) on stderr — plus
    ``{"error": {...}}`` on stdout in ``--json`` mode — and exits with its exit code.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    _register()
    debug = "--debug" in argv
    try:
        app(args=argv, prog_name="kith", standalone_mode=True)
    except KeyboardInterrupt:
        sys.exit(130)
    except SystemExit:
        raise
    except BaseException as raw:
        exc = _as_kith_error(raw)
        if exc is None or debug:
            raise
        if _wants_json(argv) and getattr(exc, "json_line", True):  # False: stdout already says why
            sys.stdout.write(json.dumps({"error": exc.to_dict()}) + "\n")
            sys.stdout.flush()
        err_console.print(f"[red]error[/red] {escape('[' + exc.code + ']')}: {escape(safe_text(exc.message))}",
                          highlight=False)
        if exc.hint:
            err_console.print(f"  hint: {escape(safe_text(exc.hint))}", highlight=False)
        sys.exit(exc.exit_code)


if __name__ == "__main__":  # pragma: no cover - `python -m node.cli.main`
    from node.cli.main import main as _main  # the importable module, not __main__

    _main()
