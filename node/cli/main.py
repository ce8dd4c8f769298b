"""The ``kith`` command: one dispatcher that maps :class:`node.common.errors.KithError` to a
message on stderr (or a JSON error object in ``--json`` mode) and an exit code
(0 ok, 1 failure, 2 usage; DESIGN §13). ``--debug`` shows tracebacks instead.

The commands themselves are registered in one table (:data:`node.cli.app.COMMANDS`) and
loaded when used; this module imports neither them nor the CLI framework until it runs
one, so ``kith --version`` answers at interpreter speed.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

from node.cli.version import version_text

if TYPE_CHECKING:
    from node.common.errors import KithError


def __getattr__(name: str) -> Any:
    """``node.cli.main.app`` (the Typer app) and ``_root`` (its global-options callback)
    live in :mod:`node.cli.app`, imported on first use."""
    if name in ("app", "_root"):
        from node.cli import app as app_module

        return getattr(app_module, name)
    raise AttributeError(name)


def _register() -> None:
    """Load every command of the registration table (:func:`node.cli.app.load_all`);
    raises when one cannot load. Kept under its old name: tests call it."""
    from node.cli.app import load_all

    load_all()


def print_error(exc: KithError, *, json_out: bool = False) -> None:
    """The one error printer of ``kith``: ``error [code]: message`` (then ``  hint: ...``
    when the error has one) on stderr, text made safe (:func:`node.cli.common.safe_text`);
    with ``json_out`` first ``{"error": {code, message[, hint]}}`` on stdout, unless the
    error says stdout already told why (``json_line`` False). Both streams are flushed.

    Args:
        exc: the refusal to report. json_out: the command runs in ``--json`` mode.
    """
    from rich.markup import escape

    from node.cli.common import err_console, safe_text

    if json_out and getattr(exc, "json_line", True):
        sys.stdout.write(json.dumps({"error": exc.to_dict()}) + "\n")
        sys.stdout.flush()
    err_console.print(f"[red]error[/red] {escape('[' + exc.code + ']')}: {escape(safe_text(exc.message))}",
                      highlight=False)
    if exc.hint:
        err_console.print(f"  hint: {escape(safe_text(exc.hint))}", highlight=False)
    sys.stderr.flush()


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: run the CLI and exit with its status.

    ``kith --version`` alone is answered before the CLI framework is imported. Usage
    errors and ``--help`` are handled by the CLI library (exit 2 / 0), but under ``--json``
    a usage error it finds is raised as the ``usage`` refusal
    (:func:`node.cli.app.usage_refusal`) and printed here like any other; a
    :class:`KithError` (also when raised inside a task group, or a local I/O failure mapped
    to ``io-error``) is reported by :func:`print_error` and exits with its exit code.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv == ["--version"]:
        sys.stdout.write(version_text() + "\n")
        sys.stdout.flush()
        sys.exit(0)
    from node.cli.app import app

    debug = "--debug" in argv
    try:
        app(args=argv, prog_name="kith", standalone_mode=True)
    except KeyboardInterrupt:
        sys.exit(130)
    except SystemExit:
        raise
    except BaseException as raw:
        from node.common.dbfaults import refusal_of  # the one mapping (also kith host's, the runner's)

        exc = refusal_of(raw)
        if exc is None or debug:
            raise
        from node.cli.app import wants_json

        print_error(exc, json_out=wants_json(argv))
        sys.exit(exc.exit_code)


if __name__ == "__main__":  # pragma: no cover - `python -m node.cli.main`
    from node.cli.main import main as _main  # the importable module, not __main__

    _main()
