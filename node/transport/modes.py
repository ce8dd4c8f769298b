"""Transport modes: which relays, which addresses, which discovery (specs/transport.md §1).

One :class:`TransportMode` says how an endpoint is bound; :func:`node.transport.iroh.bind_node`
turns it into iroh options and nothing else decides it. The command line
(``--relay``, ``--relay-only``, ``--lan``, ``--discovery``, ``--offline``) and the
``[transport]`` table of ``<home>/config.toml`` are read by :func:`mode_from`; an unknown
or contradictory value is ``transport-mode-invalid`` (exit 2) before anything is bound.
No iroh import here: the CLI validates without loading the binding.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from node.common.errors import UsageError
from node.common.home import CONFIG_FILE, config_table

#: ``--relay`` keywords: the public n0 relays (and n0's address lookup), or no relay at all.
RELAY_KEYWORDS = ("n0", "none")
#: ``--discovery`` values of LAN mode: no mDNS, advertise and resolve, resolve only.
DISCOVERY_VALUES = ("off", "on", "resolve")
#: Relay URLs one mode may name.
MAX_RELAYS = 8
#: How long a host with relays waits for its home relay before saying it cannot reach it (s).
RELAY_CHECK_S = 5.0


def _invalid(message: str) -> UsageError:
    return UsageError("transport-mode-invalid", message,
                      hint="see `kith host --help` and specs/transport.md")


def _normal_url(u: Any) -> str:
    """A relay URL as iroh writes it in a ticket: scheme and host in lower case, no default
    port (so ``https://Relay.Example.org:443`` and the ticket's ``https://relay.example.org/``
    are one relay for :meth:`node.transport.iroh.IrohNode.dial_addr`), ending in ``/``."""
    host = u.hostname
    netloc = f"[{host}]" if ":" in host else host
    if u.port is not None and u.port != {"https": 443, "http": 80}[u.scheme]:
        netloc += f":{u.port}"
    path = u.path or "/"
    return f"{u.scheme}://{netloc}{path if path.endswith('/') else path + '/'}"


def parse_relay(value: str) -> tuple[str, ...]:
    """Parse a ``--relay`` value: ``n0``, ``none`` or comma-separated ``https://`` URLs
    (no query, fragment or ``user:password@``: the URL goes into every ticket).

    Returns:
        ``("n0",)``, ``()`` for none, or the URLs (normalised as iroh writes them: lower-case
        scheme and host, no default port, a trailing ``/``; duplicates dropped).

    Raises:
        UsageError: ``transport-mode-invalid`` (exit 2) for anything else.
    """
    text = str(value).strip()
    if text == "n0":
        return ("n0",)
    if text == "none":
        return ()
    urls: list[str] = []
    for part in text.split(","):
        part = part.strip()
        try:
            u = urlsplit(part)
            ok = (u.scheme in ("https", "http") and bool(u.hostname) and not u.query and not u.fragment
                  and "@" not in u.netloc)  # no user:password: a ticket would publish it
            u.port  # noqa: B018 - raises ValueError for a bad port
        except ValueError:
            ok = False
        if not ok:
            raise _invalid(f"--relay {part[:80]!r}: give n0, none, or relay URLs (https://HOST[:PORT]/, comma-separated)")
        urls.append(_normal_url(u))
    if len(urls) > MAX_RELAYS:
        raise _invalid(f"--relay names {len(urls)} relays; at most {MAX_RELAYS}")
    return tuple(dict.fromkeys(urls))


@dataclass(frozen=True)
class TransportMode:
    """How an endpoint is bound (specs/transport.md §1).

    Attributes:
        relays: ``("n0",)`` (the public n0 relays and n0's address lookup), ``()``
            (no relay), or the owner's relay URLs (only these, never a public one).
        relay_only: tickets carry no direct address and the UDP socket is bound to
            loopback, so no peer is offered or reaches a direct path (needs relays).
        lan: bind every LAN interface, relays off (``relays`` is ``()``).
        discovery: mDNS in LAN mode: ``off``, ``on`` (advertise and resolve) or
            ``resolve`` (find hosts, never advertise).
        offline: loopback only, relays off (tests and demos; ``--offline``).
    """

    relays: tuple[str, ...] = ("n0",)
    relay_only: bool = False
    lan: bool = False
    discovery: str = "off"
    offline: bool = False

    @property
    def name(self) -> str:
        """``offline``, ``lan``, ``none``, ``n0`` or ``relays`` (the owner's own)."""
        if self.offline:
            return "offline"
        if self.lan:
            return "lan"
        if not self.relays:
            return "none"
        return "n0" if self.relays == ("n0",) else "relays"

    @property
    def uses_n0(self) -> bool:
        """Only the n0 mode publishes to n0's address lookup and uses its relays."""
        return self.name == "n0"

    @property
    def relay_urls(self) -> tuple[str, ...]:
        """The owner's relay URLs (empty for n0 and every relay-less mode)."""
        return () if self.uses_n0 else self.relays

    @property
    def bind_addr(self) -> str | None:
        """The IPv4 bind address: loopback for offline and relay-only, every interface
        otherwise (None: iroh's default; ``none`` binds every interface explicitly, so a
        kept port can be given, node/transport/port.py)."""
        if self.offline or self.relay_only:
            return "127.0.0.1:0"
        if self.lan or not self.relays:
            return "0.0.0.0:0"
        return None

    def describe(self) -> dict[str, Any]:
        """``{"mode", "relays", "relayOnly", "discovery"}`` for ``kith status --json``."""
        return {"mode": self.name, "relays": list(self.relays), "relayOnly": self.relay_only,
                "discovery": self.discovery if self.lan else "off"}

    def join_flags(self) -> str:
        """The flags a guest of this host needs (shown beside ``kith join …``)."""
        if self.offline:
            return " --offline"
        if self.lan:
            return " --lan" + (" --discovery resolve" if self.discovery != "off" else "")
        if self.relay_urls:
            return " --relay " + ",".join(self.relay_urls)
        return ""


OFFLINE = TransportMode(relays=(), offline=True)
DEFAULT = TransportMode()


def read_config(home: Path | None) -> dict[str, Any]:
    """The ``[transport]`` table of ``<home>/config.toml`` (``{}`` without the file;
    :func:`node.common.home.config_table`, the one reader of that file).

    Raises:
        UsageError: ``transport-mode-invalid`` when the file is not valid TOML, names a
            table or a ``[transport]`` key nobody reads (a typo), or the table is not a table.
    """
    return config_table(home, "transport", "transport-mode-invalid")


def _build(relay: str | None, relay_only: bool, lan: bool, discovery: str) -> TransportMode:
    """The mode of one consistent set of settings (flags, or the file's own), or
    ``transport-mode-invalid`` for a contradiction."""
    if discovery not in DISCOVERY_VALUES:
        raise _invalid(f"--discovery {str(discovery)[:40]!r}: one of {', '.join(DISCOVERY_VALUES)}")
    relays = parse_relay(relay) if relay is not None else ("n0",)
    if lan:
        if relay is not None and relays:
            raise _invalid("--lan turns relays off; it takes no --relay")
        if relay_only:
            raise _invalid("--lan and --relay-only exclude each other")
        return TransportMode(relays=(), lan=True, discovery=discovery)
    if discovery != "off":
        raise _invalid("--discovery is for LAN mode: add --lan")
    if relay_only and not relays:
        raise _invalid("--relay-only needs a relay (n0 or URLs), not --relay none")
    return TransportMode(relays=relays, relay_only=relay_only)


def _config_settings(conf: dict[str, Any]) -> dict[str, Any]:
    """The ``[transport]`` table as ``_build`` arguments, each value checked (a bad value is
    refused even when a flag overrides it: a typo is never silently kept for later)."""
    relay = conf.get("relay")
    if relay is not None:
        if isinstance(relay, list) and relay and all(isinstance(v, str) for v in relay):
            relay = ",".join(relay)
        if not isinstance(relay, str):
            raise _invalid(f"{CONFIG_FILE}: relay must be \"n0\", \"none\" or a non-empty list of URLs")
    for key in ("relay_only", "lan"):
        if key in conf and not isinstance(conf[key], bool):
            raise _invalid(f"{CONFIG_FILE}: {key} must be true or false")
    settings = {"relay": relay, "relay_only": conf.get("relay_only", False), "lan": conf.get("lan", False),
                "discovery": conf.get("discovery", "off")}
    try:
        _build(**settings)
    except UsageError as exc:
        raise _invalid(f"{CONFIG_FILE} [transport]: {exc.message}") from None
    return settings


def mode_from(*, relay: str | None = None, relay_only: bool | None = None, lan: bool | None = None,
              discovery: str | None = None, offline: bool = False, home: Path | None = None) -> TransportMode:
    """The transport mode of a command line, over ``<home>/config.toml``'s ``[transport]``
    (``relay``, ``relay_only``, ``lan``, ``discovery``).

    The file is checked on its own first (a bad or contradictory value there is refused
    even when a flag overrides it). Then a flag given wins over the file: ``--offline``
    ignores the file's mode; ``--lan`` its relay settings; ``--relay`` or ``--relay-only``
    its ``lan`` (and ``--relay none`` its ``relay_only``); a setting no flag speaks for
    comes from the file.

    Raises:
        UsageError: ``transport-mode-invalid`` (exit 2): an unknown ``--relay`` or
            ``--discovery`` value, ``--relay-only`` without a relay, ``--lan`` with a
            relay, ``--discovery`` without ``--lan``, ``--offline`` with any of them, or a
            bad ``[transport]`` table.
    """
    conf = _config_settings(read_config(home))
    if offline:
        if relay is not None or relay_only or lan or discovery not in (None, "off"):
            raise _invalid("--offline (loopback only) takes no --relay, --relay-only, --lan or --discovery")
        return OFFLINE
    if lan:  # the file's relay settings do not apply to a LAN run
        return _build(relay, bool(relay_only), True,
                      discovery if discovery is not None else conf["discovery"] if conf["lan"] else "off")
    if relay is None and relay_only is None:  # no flag picks the relays: the file's mode
        settings = {**conf, "discovery": discovery} if discovery is not None else conf
        return _build(**settings)
    relay = relay if relay is not None else None if conf["lan"] else conf["relay"]
    if relay_only is None:  # the file's relay_only, unless the flag's --relay none leaves no relay
        relay_only = conf["relay_only"] and not (relay is not None and parse_relay(relay) == ())
    return _build(relay, relay_only, False, discovery if discovery is not None else "off")


__all__ = ["CONFIG_FILE", "RELAY_CHECK_S", "DEFAULT", "DISCOVERY_VALUES", "MAX_RELAYS", "OFFLINE", "RELAY_KEYWORDS",
           "TransportMode", "mode_from", "parse_relay", "read_config"]
