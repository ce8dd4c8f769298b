"""Transport modes: which relays, which addresses, which discovery (specs/transport.md §1).

One :class:`TransportMode` says how an endpoint is bound; :func:`node.transport.iroh.bind_node`
turns it into iroh options and nothing else decides it. The command line
(``--relay``, ``--relay-only``, ``--lan``, ``--discovery``, ``--offline``) and the
``[transport]`` table of ``<home>/config.toml`` are read by :func:`mode_from`; an unknown
or contradictory value is ``transport-mode-invalid`` (exit 2) before anything is bound.
No iroh import here: the CLI validates without loading the binding.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from node.common.errors import UsageError

#: ``--relay`` keywords: the public n0 relays (and n0's address lookup), or no relay at all.
RELAY_KEYWORDS = ("n0", "none")
#: ``--discovery`` values of LAN mode: no mDNS, advertise and resolve, resolve only.
DISCOVERY_VALUES = ("off", "on", "resolve")
#: Relay URLs one mode may name.
MAX_RELAYS = 8
#: How long a host with relays waits for its home relay before saying it cannot reach it (s).
RELAY_CHECK_S = 5.0
#: The node's settings file (``[transport]`` here; ``[host]`` is node/runtime/grants.py's).
CONFIG_FILE = "config.toml"


def _invalid(message: str) -> UsageError:
    return UsageError("transport-mode-invalid", message,
                      hint="see `kith host --help` and specs/transport.md")


def parse_relay(value: str) -> tuple[str, ...]:
    """Parse a ``--relay`` value: ``n0``, ``none`` or comma-separated ``https://`` URLs.

    Returns:
        ``("n0",)``, ``()`` for none, or the URLs (normalised with a trailing ``/``).

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
            ok = u.scheme in ("https", "http") and bool(u.hostname) and not u.query and not u.fragment
            u.port  # noqa: B018 - raises ValueError for a bad port
        except ValueError:
            ok = False
        if not ok:
            raise _invalid(f"--relay {part[:80]!r}: give n0, none, or relay URLs (https://HOST[:PORT]/, comma-separated)")
        urls.append(part if part.endswith("/") else part + "/")
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
        otherwise (None: iroh's default)."""
        if self.offline or self.relay_only:
            return "127.0.0.1:0"
        if self.lan:
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
    """The ``[transport]`` table of ``<home>/config.toml`` (``{}`` without the file).

    Raises:
        UsageError: ``transport-mode-invalid`` when the file is not valid TOML or the table
            is not a table.
    """
    if home is None:
        return {}
    path = Path(home) / CONFIG_FILE
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise _invalid(f"{CONFIG_FILE} cannot be read ({type(exc).__name__})") from None
    table = data.get("transport", {})
    if not isinstance(table, dict):
        raise _invalid(f"{CONFIG_FILE}: [transport] must be a table")
    return table


def mode_from(*, relay: str | None = None, relay_only: bool | None = None, lan: bool | None = None,
              discovery: str | None = None, offline: bool = False, home: Path | None = None) -> TransportMode:
    """The transport mode of a command line, over ``<home>/config.toml``'s ``[transport]``
    (``relay``, ``relay_only``, ``lan``, ``discovery``; a flag given wins over the file).

    Raises:
        UsageError: ``transport-mode-invalid`` (exit 2): an unknown ``--relay`` or
            ``--discovery`` value, ``--relay-only`` without a relay, ``--lan`` with a
            relay, ``--discovery`` without ``--lan``, ``--offline`` with any of them.
    """
    conf = read_config(home)
    unknown = set(conf) - {"relay", "relay_only", "lan", "discovery"}
    if unknown:
        raise _invalid(f"{CONFIG_FILE}: unknown [transport] key {sorted(unknown)[0]!r}")
    if relay is None and "relay" in conf:
        value = conf["relay"]
        relay = ",".join(value) if isinstance(value, list) and all(isinstance(v, str) for v in value) else value
        if not isinstance(relay, str):
            raise _invalid(f"{CONFIG_FILE}: relay must be \"n0\", \"none\" or a list of URLs")
    for key, given in (("relay_only", relay_only), ("lan", lan)):
        if given is None and key in conf and not isinstance(conf[key], bool):
            raise _invalid(f"{CONFIG_FILE}: {key} must be true or false")
    relay_only = bool(conf.get("relay_only", False)) if relay_only is None else relay_only
    lan = bool(conf.get("lan", False)) if lan is None else lan
    if discovery is None:
        discovery = conf.get("discovery", "off")
    if discovery not in DISCOVERY_VALUES:
        raise _invalid(f"--discovery {str(discovery)[:40]!r}: one of {', '.join(DISCOVERY_VALUES)}")
    if offline:
        if relay is not None or relay_only or lan:
            raise _invalid("--offline (loopback only) takes no --relay, --relay-only or --lan")
        return OFFLINE
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


__all__ = ["CONFIG_FILE", "RELAY_CHECK_S", "DEFAULT", "DISCOVERY_VALUES", "MAX_RELAYS", "OFFLINE", "RELAY_KEYWORDS",
           "TransportMode", "mode_from", "parse_relay", "read_config"]
