"""The ``kith`` Typer app and its one registration table.

:data:`COMMANDS` names every command once: its name, the module that defines it and the
attribute there (a command function or a sub-command group's ``typer.Typer``), in the
order ``kith --help`` lists them. The root group loads a module only when its command is
resolved — ``kith join`` imports the modules ``join`` needs and no other command's — and
``kith --help`` loads them all (each module keeps its heavy imports inside its commands).
A module that fails to import, or an attribute it does not define, raises at once: no
command is ever skipped.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, MutableMapping
from typing import Any, NamedTuple, Optional

import typer
from typer.core import TyperGroup

from node.cli.common import state_of
from node.common.errors import UsageError


class Entry(NamedTuple):
    """One row of the registration table: ``kith <name>`` is ``<module>.<attr>``."""

    name: str
    module: str
    attr: str


#: Every command of ``kith``, in ``--help`` order (commands, then groups).
COMMANDS: tuple[Entry, ...] = (
    Entry("init", "node.cli.commands", "init_cmd"),
    Entry("host", "node.cli.commands", "host_cmd"),
    Entry("join", "node.cli.commands", "join_cmd"),
    Entry("search", "node.cli.index_cmd", "search_cmd"),
    Entry("browse", "node.cli.browse_cmd", "browse_cmd"),
    Entry("feedback", "node.cli.browse_cmd", "feedback_cmd"),
    Entry("mcp", "node.cli.api_cmd", "mcp_cmd"),
    Entry("audit", "node.cli.audit_cmd", "audit_cmd"),
    Entry("status", "node.cli.status_cmd", "status_cmd"),
    Entry("ask", "node.cli.ask_cmd", "ask_cmd"),
    Entry("verify", "node.cli.verify_cmd", "verify_cmd"),
    Entry("dashboard", "node.cli.dashboard_cmd", "dashboard_cmd"),
    Entry("protocol", "node.cli.commands", "protocol_app"),
    Entry("index", "node.cli.index_cmd", "index_app"),
    Entry("policy", "node.cli.policy_cmd", "policy_app"),
    Entry("peers", "node.cli.peers_cmd", "peers_app"),
    Entry("approvals", "node.cli.approvals_cmd", "approvals_app"),
    Entry("outbox", "node.cli.outbox_cmd", "outbox_app"),
    Entry("copies", "node.cli.copies_cmd", "copies_app"),
    Entry("community", "node.cli.community_cmd", "community_app"),
    Entry("api", "node.cli.api_cmd", "api_app"),
    Entry("agent", "node.cli.agent_cmd", "agent_app"),
    Entry("sent", "node.cli.sent_cmd", "sent_app"),
    Entry("sessions", "node.cli.status_cmd", "sessions_app"),
    Entry("device", "node.cli.device_cmd", "device_app"),
    Entry("person", "node.cli.person_cmd", "person_app"),
)


def load(entry: Entry) -> Any:
    """The click command for ``entry``, built the way Typer builds a registered one (the
    root's settings: no rich markup, short exceptions).

    Raises:
        ImportError: the module cannot be imported (never skipped).
        AttributeError: the module has no ``entry.attr``.
    """
    # __import__, not importlib.import_module: the import statement's path, which
    # ``python -X importtime`` reports (tests/test_cli_startup.py reads it)
    target = getattr(__import__(entry.module, fromlist=[entry.attr]), entry.attr)
    holder = typer.Typer(rich_markup_mode=None, pretty_exceptions_enable=False, add_completion=False)
    if isinstance(target, typer.Typer):
        holder.add_typer(target, name=entry.name)
    else:
        holder.command(entry.name)(target)
    return typer.main.get_group(holder).commands[entry.name]


class _Table(MutableMapping):
    """The root group's ``commands``: keys are the table's names (known without importing
    anything); a value is loaded by :func:`load` when first looked up."""

    def __init__(self) -> None:
        self._entries = {e.name: e for e in COMMANDS}
        self._loaded: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        if name not in self._loaded:
            self._loaded[name] = load(self._entries[name])  # KeyError: not a command
        return self._loaded[name]

    def __setitem__(self, name: str, command: Any) -> None:
        self._loaded[name] = command
        self._entries.setdefault(name, Entry(name, "", ""))

    def __delitem__(self, name: str) -> None:
        self._loaded.pop(name, None)
        del self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)


#: ``ctx.meta`` key: the command line asks for ``--json`` (set by :meth:`TableGroup.make_context`)
_JSON_META = "kith.json"
#: ``ctx.meta`` key: the context of the command the command line names (:func:`named_command`)
_COMMAND_META = "kith.command"
#: the exceptions module of the click Typer runs on (Typer's own copy in recent versions,
#: else click itself): its ``UsageError`` is what a refused command line raises
_LIBRARY = sys.modules[typer.BadParameter.__module__]
#: what the library raises for a group run without a sub-command (its help is printed)
_NO_ARGS = getattr(_LIBRARY, "NoArgsIsHelpError", ())


#: ``--json=VALUE`` values that ask for text, not JSON (the library refuses every value)
_NOT_JSON = frozenset({"0", "false", "no", "off"})


def wants_json(argv: list[str]) -> bool:
    """Whether the command line ``argv`` asks for ``--json`` output: then a refusal is
    also printed as ``{"error": ...}`` on stdout (:func:`node.cli.main.print_error`). A
    ``--json`` after ``--`` is an argument (``kith search -- --json`` looks for the word),
    not the option. ``--json`` is a flag that takes no value: ``--json=1`` is refused
    (``usage``), but it asked for JSON, so the refusal is the JSON object too — unless its
    value says no (``--json=0``, ``false``, ``no``, ``off``)."""
    end = argv.index("--") if "--" in argv else len(argv)
    return any(arg == "--json" or (arg.startswith("--json=") and arg[7:].strip().lower() not in _NOT_JSON)
               for arg in argv[:end])


def _is_option(arg: str) -> bool:
    return arg[:1] == "-" and len(arg) > 1  # what the library's parser takes for an option ("-" is not)


def _is_long_option(arg: str) -> bool:
    return arg[:2] == "--" and arg[2:3].isalpha()  # --json, --top-k=3 (not "---", "--1")


def options_of(command: Any, ctx: Any) -> dict[str, Any]:
    """Every option name of ``command`` (``--top-k``, ``-p``, ``--local``, ``-h``) → its
    option (the library's parameter). ``ctx``: the command's context."""
    return {name: p for p in command.get_params(ctx) if p.param_type_name == "option"
            for name in (*p.opts, *p.secondary_opts)}


def own_tokens(command: Any, ctx: Any, args: list[str]) -> int:
    """How many of ``args`` (what follows ``command``'s name on the command line) are
    ``command``'s own: its options with their values — for a group, the ones before its
    sub-command's name (the library parses a group's options only there), for a command all
    of them, up to ``--``.

    An option that takes a value is refused when the next word is ``--``, a long option
    (``--`` and a letter: ``kith search --top-k --json q``, ``kith --home --json status``)
    or one of the command's short ones (``-h``): the library would take that word as the
    value (``'--json' is not a valid int``, or ``--source --json`` searching for the glob
    ``--json`` with no JSON printed). Such a value is given as ``--source=--json``.

    Args:
        command: a command or group of the CLI library. ctx: its context (not parsed).
        args: the command line after the command's name.

    Raises:
        the library's ``BadOptionUsage`` (a usage error, exit 2), naming the option.
    """
    names = options_of(command, ctx)
    i = 0
    while i < len(args) and args[i] != "--":
        opt = args[i]
        option = names.get(opt)
        if option is None:
            if not ctx.allow_interspersed_args and not _is_option(opt):
                break  # a group's sub-command: the rest is its own
            i += 1
            continue
        takes = 0 if option.is_flag or option.count else option.nargs
        for word in args[i + 1:i + 1 + takes]:
            if word == "--" or _is_long_option(word) or word.split("=", 1)[0] in names:
                given = f"{opt}={word}" if opt.startswith("--") else f"{opt}{word}"
                what = "ends the options" if word == "--" else "is taken for an option, not its value"
                raise _LIBRARY.BadOptionUsage(opt, f"Option {opt!r} requires an argument: {word!r} after it {what} "
                                                   f"(to give it as the value, write {given}).", ctx=ctx)
        i += 1 + takes
    return i


def named_command(root: Any, ctx: Any, args: list[str]) -> Any:
    """The context of the command ``args`` names (``kith policy set …`` → ``policy set``),
    unparsed: its ``command_path`` and usage line. The root's ``ctx`` when ``args`` names
    no command (``kith --home``, ``kith nope``).

    Args:
        root: the root group. ctx: its context. args: the whole command line.

    Raises:
        what :func:`own_tokens` raises; and the library's ``BadOptionUsage`` for an option
        of the command given before it, to a group that has no such option (``kith --json
        status``: the library said ``No such option: --json (Possible options:
        --version)``).
    """
    groups = [(ctx, args[:own_tokens(root, ctx, args)])]  # each group's context and its own words
    i, command = len(groups[0][1]), root
    while i < len(args) and hasattr(command, "get_command"):
        sub = command.get_command(ctx, args[i])
        if sub is None:
            break
        ctx = sub.context_class(sub, info_name=args[i], parent=ctx)
        command, i = sub, i + 1
        mine = own_tokens(command, ctx, args[i:])
        groups.append((ctx, args[i:i + mine]))
        i += mine
    theirs = options_of(command, ctx)
    for group, words in groups[:-1]:
        known = options_of(group.command, group)
        for opt in (w.split("=", 1)[0] for w in words if _is_option(w)):
            if opt not in known and opt in theirs:
                path = ctx.command_path
                raise _LIBRARY.BadOptionUsage(opt, f"No such option: {opt} (it is an option of `{path}`: give it "
                                                   f"after the command, `{path} … {opt}`)", ctx=ctx)
    return ctx


def usage_refusal(exc: Any) -> UsageError:
    """The ``usage`` refusal (exit 2) for a command-line error the CLI library found (a
    missing argument, an unknown option, a bad choice or value): the library's message, and
    a hint naming the command's ``--help``. What ``kith … --json`` reports instead of the
    library's text (specs/error-codes.md), through the dispatcher's one error printer
    (:func:`node.cli.main.print_error`).

    Args:
        exc: the library's ``UsageError`` (``format_message()``, ``ctx``).
    """
    path = exc.ctx.command_path if exc.ctx is not None else "kith"
    return UsageError("usage", exc.format_message(), hint=f"`{path} --help` shows its arguments and options")


class TableGroup(TyperGroup):
    """The root ``kith`` group: its commands come from :data:`COMMANDS`, each loaded on
    first use. A command line with ``--json`` whose options or arguments the CLI library
    refuses raises :func:`usage_refusal` (exit 2, printed as ``{"error": {"code": "usage",
    ...}}`` like every usage error); without ``--json`` the library prints its own usage
    text, as before."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        self.commands = _Table()

    def make_context(self, info_name: Optional[str], args: list[str], parent: Any = None, **extra: Any) -> Any:
        json_out = wants_json(args)
        try:
            ctx = super().make_context(info_name, args, parent=parent, **extra)
        except _NO_ARGS:
            raise  # `kith` alone prints its help
        except _LIBRARY.UsageError as exc:
            if not json_out:
                raise
            raise usage_refusal(exc) from None
        ctx.meta[_JSON_META] = json_out
        return ctx

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        ctx.meta[_COMMAND_META] = named_command(self, ctx, args)
        return super().parse_args(ctx, args)

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except _NO_ARGS:
            raise  # a group given no sub-command prints its help
        except _LIBRARY.UsageError as exc:  # a sub-command's arguments, or a value a command refused
            if exc.ctx is None:  # the library's parser raises some without it (`--json=1`):
                exc.ctx = ctx.meta.get(_COMMAND_META)  # name the command, its usage and --help
            if not ctx.meta.get(_JSON_META):
                raise
            raise usage_refusal(exc) from None

    def list_commands(self, ctx: Any) -> list[str]:
        return list(self.commands)  # the names only: listing loads nothing

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        try:
            return self.commands[cmd_name]
        except KeyError:
            return None


def load_all() -> None:
    """Load every command of the table (``--help`` of every command, the reference,
    tests). Raises what :func:`load` raises."""
    for entry in COMMANDS:
        load(entry)


app = typer.Typer(
    name="kith",
    cls=TableGroup,
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


def _print_version(value: bool) -> None:
    if value:
        import sys

        from node.cli.version import version_text

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
