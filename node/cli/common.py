"""Shared CLI plumbing: the per-invocation state, JSON output, and error reporting.

Every command gets the node home from :func:`home_of` and prints data with
:func:`emit_json` (stdout carries only JSON in ``--json`` mode, DESIGN §13) or through
:data:`console`; logs, progress and warnings go to :data:`err_console` (stderr).
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import re
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, get_type_hints

import typer

from node.cli.safe import safe_text
from node.common.home import AGENTS_FILE, IDENTITY_FILE, create_home, home_initialized, require_home, resolve_home

#: a C0 control character other than newline: rich's text strips some and expands tabs
_RICH_CONTROL = re.compile("[\x00-\x09\x0b-\x1f]")
#: rich's emoji code (``:name:``, rich/_emoji_replace.py): a string with none prints as written
_EMOJI_CODE = re.compile(r":\S*?:")
#: ``print`` keywords the plain path honours; any other one goes to rich
_PLAIN_KEYWORDS = frozenset({"sep", "end", "markup", "emoji", "highlight", "soft_wrap"})
#: held while a :class:`LazyConsole` builds its console
_BUILD_LOCK = threading.Lock()


def _terminal_by_rich_rule(stream: Any) -> bool | None:
    """Whether rich would call ``stream`` a terminal (``rich.console.Console.is_terminal``,
    for a console without ``force_terminal``), decided without importing rich; None when
    only rich can tell (a Jupyter kernel)."""
    import builtins

    if getattr(sys.stdin, "__module__", "").startswith("idlelib"):
        return False
    if hasattr(builtins, "get_ipython"):
        return None
    tty_compatible = os.environ.get("TTY_COMPATIBLE", "")
    if tty_compatible in ("0", "1"):
        return tty_compatible == "1"
    force_color = os.environ.get("FORCE_COLOR")
    if force_color is not None:
        return force_color != ""
    isatty = getattr(stream, "isatty", None)
    try:
        return False if isatty is None else bool(isatty())
    except ValueError:
        return False


class LazyConsole:
    """stdout's or stderr's console (:mod:`node.cli.consoles`), built on first use: rich is
    imported only when output is rendered with it (issue 44: a guest that starts fast).

    Off a terminal, before the console is built, :meth:`print` of plain strings writes them
    itself, exactly as the console would (the joined text and ``end``, flushed): a
    ``kith join --json`` or a piped ``kith join`` never imports rich. Anything rich would
    change — a terminal, markup (a ``[`` with markup on), an emoji code (``:name:`` with
    emoji on), a control character but newline (rich strips some and expands tabs), a
    renderable, ``soft_wrap=False``, a keyword the plain path does not know — builds the
    console and hands it the call. Every other attribute is the built console's (reading
    or setting one builds it); once built, every call goes to it.

    Args:
        build: returns the console (called once).
        stderr: the console writes to ``sys.stderr`` (else ``sys.stdout``), the stream of
            the moment as rich's own ``file`` is.
        markup, emoji: the console's defaults (``print(markup=None)`` means these).
        untrusted: every string passes :func:`safe_text` and markup and emoji codes are
            never parsed (:class:`node.cli.consoles._UntrustedConsole`).
    """

    __slots__ = ("_build", "_real", "_stderr", "_markup", "_emoji", "_untrusted")

    def __init__(self, build: Callable[[], Any], *, stderr: bool = False, markup: bool = True,
                 emoji: bool = True, untrusted: bool = False) -> None:
        for name, value in (("_build", build), ("_real", None), ("_stderr", stderr), ("_markup", markup),
                            ("_emoji", emoji), ("_untrusted", untrusted)):
            object.__setattr__(self, name, value)

    def real(self) -> Any:
        """The rich console, built now if it was not yet (imports rich); built once, also
        when two threads (the join's prompt worker and its event loop) ask at once."""
        if self._real is None:
            with _BUILD_LOCK:
                if self._real is None:
                    object.__setattr__(self, "_real", self._build())
        return self._real

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real(), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.real(), name, value)

    def __delattr__(self, name: str) -> None:
        delattr(self.real(), name)

    @property
    def file(self) -> Any:
        """The stream printed to (rich's ``Console.file``)."""
        if self._real is not None:
            return self._real.file
        stream = sys.stderr if self._stderr else sys.stdout
        stream = getattr(stream, "rich_proxied_file", stream)
        return stream if stream is not None else self.real().file

    @property
    def is_terminal(self) -> bool:
        """rich's ``Console.is_terminal`` (without importing rich when the rule can tell)."""
        if self._real is None:
            verdict = _terminal_by_rich_rule(self.file)
            if verdict is not None:
                return verdict
        return bool(self.real().is_terminal)

    def print(self, *objects: Any, **kwargs: Any) -> None:
        """rich's ``Console.print``; plain strings off a terminal are written directly."""
        text = self._plain(objects, kwargs) if self._real is None else None
        if text is None:
            self.real().print(*objects, **kwargs)
            return
        stream = self.file
        stream.write(text)
        stream.flush()

    def _plain(self, objects: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
        """What the console would write for this call when it is plain text off a terminal,
        else None (rich must render it)."""
        if not kwargs.keys() <= _PLAIN_KEYWORDS or kwargs.get("soft_wrap") is False or kwargs.get("highlight"):
            return None
        sep, end = kwargs.get("sep", " "), kwargs.get("end", "\n")
        if not objects or not all(type(o) is str for o in (*objects, sep, end)):
            return None
        if self._untrusted:  # as _UntrustedConsole: every piece it writes is made safe
            objects, sep, end = tuple(safe_text(o) for o in objects), safe_text(sep), safe_text(end)
        text = sep.join(objects)
        markup = False if self._untrusted else kwargs.get("markup")
        emoji = False if self._untrusted else kwargs.get("emoji")
        if ((self._markup if markup is None else markup) and "[" in text
                or (self._emoji if emoji is None else emoji) and _EMOJI_CODE.search(text)
                or _RICH_CONTROL.search(text + end)):
            return None
        if self.is_terminal:
            return None
        return text + end


def _stdout_console() -> Any:
    from node.cli.consoles import _KithConsole

    return _KithConsole()


def _stderr_console() -> Any:
    from node.cli.consoles import _KithConsole

    return _KithConsole(stderr=True, soft_wrap=True)


def _untrusted_console() -> Any:
    from node.cli.consoles import _UntrustedConsole

    return _UntrustedConsole()


def __getattr__(name: str) -> Any:
    """The console classes and :data:`PIPE_WIDTH` live in :mod:`node.cli.consoles` (they
    import rich), loaded on first use."""
    if name in ("_KithConsole", "_UntrustedConsole", "PIPE_WIDTH"):
        from node.cli import consoles

        return getattr(consoles, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: stdout
console = LazyConsole(_stdout_console)
#: stderr; soft_wrap so a one-line error stays one line when stderr is a file or pipe
err_console = LazyConsole(_stderr_console, stderr=True)


#: stdout for data shown to a person that includes peer/server-supplied text
untrusted_console = LazyConsole(_untrusted_console, markup=False, emoji=False, untrusted=True)


@dataclass
class CliState:
    """Options given before the sub-command (``kith --home D --debug <command>``)."""

    home_arg: str | None = None
    debug: bool = False

    @property
    def home_path(self) -> Path:
        """The node home's path as given (``--home``, ``$KITH_HOME`` or the default),
        neither checked nor created."""
        return resolve_home(self.home_arg)


def state_of(ctx: typer.Context) -> CliState:
    """Return the :class:`CliState` stored on the root context."""
    root = ctx.find_root()
    if not isinstance(root.obj, CliState):
        root.obj = CliState()
    return root.obj


def home_of(ctx: typer.Context, *, server: bool = False, agent: bool = True) -> Path:
    """The node home of this invocation (``--home``, ``$KITH_HOME`` or the default), which
    must be an initialised home: the one check every command but ``init`` and ``community
    serve`` (:func:`new_home_of`) passes. Nothing is created, so a typo in ``--home``
    is refused instead of becoming a new, empty home (issue 20).

    Args:
        server: accept a home ``kith community serve`` made (``community migrate``,
            ``backup``) as well as one ``kith init`` made.
        agent: a home made before agents gets its agent ``default`` now
            (:func:`default_agent`); False: the command makes it itself once nothing can
            refuse it (``kith host``: a refused start leaves the home as it was).

    Raises:
        ConfigError: ``home-not-a-folder`` (the path is a file), ``home-not-initialized``
            (no such home yet; the ``kith --home DIR init`` hint).
    """
    home = require_home(state_of(ctx).home_path, server=server)
    if agent and (home / IDENTITY_FILE).is_file():  # not a community server's home
        default_agent(home)
    return home


def default_agent(home: Path) -> None:
    """The first command in a home made before agents creates the agent ``default``
    (node/local/agents.py) and says how to get its token (it is never printed here);
    nothing when ``<home>/agents.json`` exists (then the agents module is not imported:
    every command of a home runs this), nor in a home this process may not write
    (:func:`node.local.agents.ensure_default_agent` leaves it as it is)."""
    if (home / AGENTS_FILE).exists():
        return
    from node.local.agents import ensure_default_agent

    if ensure_default_agent(home) is not None:
        warn("created the agent 'default' (every source, every pinned peer, the outbox; outbound: ask) "
             "for `kith mcp` and the local API; `kith agent rotate default` prints its token")


#: The same check: every command that reads the home needs an initialised one.
identity_home_of = home_of


def new_home_of(ctx: typer.Context) -> Path:
    """The node home, created (0700) when missing: ``kith init`` and ``kith community
    serve`` only.

    Raises:
        ConfigError: ``home-not-a-folder`` when the path is a file.
    """
    return create_home(state_of(ctx).home_path)


def home_if_any(ctx: typer.Context) -> Path | None:
    """The node home when it is an initialised one, else None — for a command that works
    without a home and only looks in it when there is one (``kith protocol test|id NAME``
    finds protocols in ``<home>/protocols``, then the bundled ones)."""
    home = state_of(ctx).home_path
    return home if home.is_dir() and home_initialized(home) else None


def emit_json(obj: Any) -> None:
    """Print one JSON document on one line to stdout and flush (JSON-Lines friendly)."""
    sys.stdout.write(json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def stdin_is_terminal() -> bool:
    """True when stdin is a terminal someone types at; False for a pipe or a file, and for
    a closed stdin (``kith … <&-``: ``sys.stdin`` is None, whose ``isatty`` raised)."""
    return sys.stdin is not None and sys.stdin.isatty()


def stdin_line() -> str:
    """One line of stdin, or ``""`` when stdin is closed (``sys.stdin`` is None)."""
    return sys.stdin.readline() if sys.stdin is not None else ""


def list_options_only(ctx: typer.Context) -> None:
    """A group that lists when run alone (``kith sent``, ``kith sessions``) and has
    sub-commands: its own options shape that list, so given before a sub-command (``kith
    sent --json approve ID``) they are refused — they were ignored, and ``--json`` there
    printed the sub-command's text on success (and the JSON object on failure).

    Args:
        ctx: the group's context, a sub-command named (``ctx.invoked_subcommand``).

    Raises:
        UsageError: ``usage`` naming the options given (exit 2; the ``{"error": ...}``
            object under ``--json``).
    """
    from node.common.errors import UsageError

    given = [p.opts[0] for p in ctx.command.params if p.param_type_name == "option"
             and getattr(ctx.get_parameter_source(p.name), "name", "DEFAULT") != "DEFAULT"]
    if given:
        sub = ctx.invoked_subcommand
        raise UsageError("usage", f"{', '.join(given)} before `{sub}`: the options of `{ctx.command_path}` shape "
                                  f"its list and do not apply to `{sub}`",
                         hint=f"give `{sub}` its own options after it (`{ctx.command_path} {sub} --help`)")


def confirm_or_refuse(question: str, *, yes: bool, off_terminal: Exception, declined: Exception) -> None:
    """The one confirmation of a change the owner must agree to (``kith policy`` and
    ``kith peers`` changes that stop scrubbing, ``kith person rotate``): nothing with
    ``yes`` (``--yes``); at a terminal ``question`` and ``[y/N]`` on stderr, and one line of
    stdin read; off a terminal (stdin not a TTY: a script, a pipe) a refusal — nobody is
    there to ask, so nothing is changed unasked.

    Args:
        question: what is asked (one line, plain text; ``[y/N]`` is added).
        yes: the owner confirmed on the command line.
        off_terminal: raised when stdin is not a terminal and ``yes`` is not given (a
            :class:`node.common.errors.KithError` whose hint names ``--yes``).
        declined: raised when the answer read is not ``y`` or ``yes``.
    """
    if yes:
        return
    if not stdin_is_terminal():
        raise off_terminal
    err_console.print(f"{question} [y/N] ", end="", markup=False, highlight=False)
    if stdin_line().strip().lower() not in ("y", "yes"):
        raise declined


def confirm_outbound(holds: list[Any]) -> bool | None:
    """Ask the owner at a terminal whether to send a question the outbound gate held
    (node/policy/outbound.py): the kinds and source ids (never the text), then ``[y/N]``
    for :data:`node.policy.outbound.PROMPT_TIMEOUT_S` seconds.

    Returns:
        True to send, False when refused, None when nobody answered in time (denied).
    """
    import select

    from node.policy.outbound import PROMPT_TIMEOUT_S

    kinds = sorted({h.kind + (f" from {h.source}" if h.source else "") + (f" (hidden from {h.peer})" if h.peer else "")
                    for h in holds})
    err_console.print(safe_text("the question carries " + "; ".join(kinds)), highlight=False, markup=False)
    err_console.print(f"send it anyway? [y/N] ({PROMPT_TIMEOUT_S} s) ", end="", highlight=False, markup=False)
    ready, _, _ = select.select([sys.stdin], [], [], PROMPT_TIMEOUT_S)
    if not ready:
        err_console.print("", highlight=False)
        return None
    return sys.stdin.readline().strip().lower() in ("y", "yes")


def warn(message: str) -> None:
    """Print a warning line to stderr."""
    from rich.text import Text

    line = Text("warning: ", style="yellow")
    line.append(safe_text(message))  # plain text: no markup, no control characters
    err_console.print(line, highlight=False)


# ----------------------------------------------------------------------------- transport
#: ``--help`` texts of the transport options (:func:`transport_options`; specs/transport.md §1).
RELAY_HELP = ("Relays: n0 (the public n0 relays and address lookup; default), none (direct only), or "
              "URL[,URL] (only these relays, your own; never a public one). Config: [transport] relay "
              "in <home>/config.toml.")
RELAY_ONLY_HELP = ("Relay only: tickets carry no IP address and UDP is bound to loopback, so no peer "
                   "learns this machine's address or gets a direct path (needs a relay).")
LAN_HELP = "LAN only: bind the LAN interfaces, relays off, nothing published outside the LAN."
DISCOVERY_HELP = ("LAN discovery over mDNS: off (default), on (advertise and resolve), resolve (find "
                  "hosts, never advertise). Needs --lan.")
OFFLINE_HELP = "Offline: loopback only, relays off (tests, demos). Env: KITH_OFFLINE=1."
LOCAL_DEPRECATED_HELP = "Deprecated spelling of --offline (kept working; `kith ask --local` is the own corpus)."


def transport_mode(home: Path | None, *, relay: str | None, relay_only: bool, lan: bool, discovery: str | None,
                   offline: bool, local: bool = False, command: str = "host") -> Any:
    """The :class:`node.transport.modes.TransportMode` of a command line (over
    ``<home>/config.toml``); ``--local`` (deprecated on ``host``/``join``) is ``--offline``
    with a note on stderr.

    Raises:
        UsageError: ``transport-mode-invalid`` (exit 2), see
            :func:`node.transport.modes.mode_from`.
    """
    from node.transport.modes import mode_from

    if local:
        err_console.print(f"note: `kith {command} --local` is deprecated; use --offline (same meaning)",
                          highlight=False, markup=False)
        offline = True
    return mode_from(relay=relay, relay_only=relay_only or None, lan=lan or None, discovery=discovery,
                     offline=offline, home=home)


def command_group(help: str) -> typer.Typer:
    """A ``kith`` command group (``kith peers``, ``kith outbox``, ...): ``help`` is its
    ``--help`` text, and run with no subcommand it prints that help."""
    return typer.Typer(help=help, no_args_is_help=True)


def json_option(help: str = "Print JSON on stdout.") -> Any:
    """The one declaration of ``--json``: a flag (default False) whose ``--help`` text is
    ``help``. Use as a parameter default: ``as_json: bool = json_option()``."""
    return typer.Option(False, "--json", help=help)


#: ``--host``'s help for the owner-only servers (the local API, the dashboard)
LOOPBACK_HOST_HELP = "Loopback address to listen on (a non-loopback one is refused)."


def host_option(help: str = LOOPBACK_HOST_HELP) -> Any:
    """The one declaration of a server command's ``--host ADDR`` (default 127.0.0.1), as a
    parameter default: ``host: str = host_option()``."""
    return typer.Option("127.0.0.1", "--host", metavar="ADDR", help=help)


def port_option(default: int) -> Any:
    """The one declaration of a server command's ``--port`` (``default``; 0 picks a free
    one), as a parameter default: ``port: int = port_option(8765)``."""
    return typer.Option(default, "--port", min=0, max=65535, help="TCP port (0 picks a free one).")


#: ``--server URL`` (or ``$KITH_SERVER``) of the community server's client commands
SERVER_HELP = "Community server URL (default: $KITH_SERVER)."


def server_option(help: str = SERVER_HELP, *, from_env: bool = True) -> Any:
    """The one declaration of ``--server URL``, the community server a command talks to.

    Use as a parameter default: ``server: Optional[str] = server_option()`` (None when not
    given). The client commands (``community ...``, ``browse``) also read ``$KITH_SERVER``;
    the commands where a server is an extra (``host``, ``join``, ``peers add``, ``device
    revoke``) pass ``from_env=False`` and their own ``help``, so setting the variable never
    makes them publish to or fetch from a server the command line did not name.

    Args:
        help: the option's ``--help`` text.
        from_env: read ``$KITH_SERVER`` when ``--server`` is not given.

    Returns:
        A ``typer.Option`` declaration (metavar ``URL``).
    """
    return typer.Option(None, "--server", metavar="URL", envvar="KITH_SERVER" if from_env else None, help=help)


@dataclass(frozen=True)
class TransportArgs:
    """The transport options of one command line, as given (:func:`transport_options`)."""

    offline: bool = False
    relay: str | None = None
    relay_only: bool = False
    lan: bool = False
    discovery: str | None = None
    #: ``--local``, the deprecated spelling of ``--offline`` (``host`` and ``join`` only)
    local: bool = False

    def mode(self, home: Path | None, command: str) -> Any:
        """The :class:`node.transport.modes.TransportMode` of these options for ``kith
        <command>`` (:func:`transport_mode`)."""
        return transport_mode(home, relay=self.relay, relay_only=self.relay_only, lan=self.lan,
                              discovery=self.discovery, offline=self.offline, local=self.local, command=command)


def _transport_parameters(deprecated_local: bool) -> list[inspect.Parameter]:
    """The transport options as parameters Typer reads: ``--offline`` (``--local``),
    ``--relay``, ``--relay-only``, ``--lan``, ``--discovery``, in ``--help`` order."""
    def option(name: str, annotation: Any, info: Any) -> inspect.Parameter:
        return inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=info, annotation=annotation)

    params = [option("offline", bool, typer.Option(False, "--offline", envvar="KITH_OFFLINE", help=OFFLINE_HELP))]
    if deprecated_local:
        params.append(option("local", bool, typer.Option(False, "--local", help=LOCAL_DEPRECATED_HELP)))
    return params + [
        option("relay", Optional[str], typer.Option(None, "--relay", metavar="n0|none|URL[,URL]", help=RELAY_HELP)),
        option("relay_only", bool, typer.Option(False, "--relay-only", help=RELAY_ONLY_HELP)),
        option("lan", bool, typer.Option(False, "--lan", help=LAN_HELP)),
        option("discovery", Optional[str], typer.Option(None, "--discovery", metavar="off|on|resolve",
                                                        help=DISCOVERY_HELP)),
    ]


def transport_options(*, deprecated_local: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The one declaration of the transport options every command that dials takes
    (``host``, ``join``, ``ask``, ``outbox run``, ``copies sync``).

    A decorator: the command's parameter ``transport: TransportArgs`` stands, in ``--help``
    and on the command line, for ``--offline``, ``--relay``, ``--relay-only``, ``--lan`` and
    ``--discovery`` (with ``deprecated_local``, ``--local`` after ``--offline``), in its
    place among the other options; the command receives them as one :class:`TransportArgs`.
    """
    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        hints = get_type_hints(fn)
        added = _transport_parameters(deprecated_local)
        names = [p.name for p in added]
        own = inspect.signature(fn).parameters
        if "transport" not in own:
            raise TypeError(f"{fn.__name__} has no parameter `transport: TransportArgs`")
        params: list[inspect.Parameter] = []
        for p in own.values():
            params.extend(added if p.name == "transport" else [p.replace(annotation=hints.get(p.name, p.annotation))])

        @functools.wraps(fn)
        def command(*args: Any, **kwargs: Any) -> Any:
            given = TransportArgs(**{name: kwargs.pop(name) for name in names})
            return fn(*args, transport=given, **kwargs)

        del command.__wrapped__  # Typer reads the signature below, not fn's
        command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command

    return wrap
