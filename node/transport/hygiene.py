"""Address hygiene (specs/transport.md §5): which addresses are dialled, and which ones a
published ticket should not carry.

A node dials a peer's addresses only for the endpoint id they came with (the QUIC
handshake then proves that id, or the connection fails), never anything else. What it
publishes in a ticket is only what its own endpoint observed (iroh's own address list,
:meth:`node.transport.iroh.IrohNode.ticket`); it stores no address a peer told it about
a third party and forwards none. Pure functions over address strings (iroh is imported only
to parse a ticket).
"""

from __future__ import annotations

import ipaddress
from typing import Iterable

#: Direct addresses of one ticket that are dialled at most (a hostile ticket listing
#: hundreds would make the guest spray QUIC Initial packets at them).
MAX_DIAL_ADDRS = 8


def _ip_of(addr: str) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int] | None:
    """``(ip, port)`` of ``"1.2.3.4:5"`` / ``"[::1]:5"``, or None if it is not one."""
    text = str(addr).strip()
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        return None
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return None
    return ip, int(port)


def dialable(addresses: Iterable[str]) -> list[str]:
    """The addresses of a ticket that may be dialled: real unicast ``IP:port`` pairs with a
    port, without unspecified (``0.0.0.0``, ``::``), multicast, broadcast or reserved
    ones, at most :data:`MAX_DIAL_ADDRS` (first ones kept, duplicates dropped)."""
    out: list[str] = []
    for addr in addresses:
        parsed = _ip_of(addr)
        if parsed is None:
            continue
        ip, port = parsed
        if port == 0 or ip.is_unspecified or ip.is_multicast or ip.is_reserved:
            continue
        if isinstance(ip, ipaddress.IPv4Address) and ip == ipaddress.IPv4Address("255.255.255.255"):
            continue
        if addr not in out:
            out.append(addr)
        if len(out) >= MAX_DIAL_ADDRS:
            break
    return out


#: Networks that describe the owner's own network and mean nothing to a stranger:
#: RFC 1918, CGNAT (RFC 6598), link-local, loopback, IPv6 unique-local and link-local.
PRIVATE_NETWORKS = tuple(ipaddress.ip_network(n) for n in (
    "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "169.254.0.0/16", "127.0.0.0/8",
    "fc00::/7", "fe80::/10", "::1/128"))


def private_addresses(addresses: Iterable[str]) -> list[str]:
    """The addresses in :data:`PRIVATE_NETWORKS` (private, CGNAT, link-local, loopback,
    unique-local). A public post whose ticket carries them is worth a warning."""
    out = []
    for addr in addresses:
        parsed = _ip_of(addr)
        if parsed is not None and any(parsed[0] in net for net in PRIVATE_NETWORKS if net.version == parsed[0].version):
            out.append(addr)
    return out


def relay_dialable(url: str | None) -> bool:
    """May a guest in the n0 mode contact the relay URL a ticket names? Only ``https`` URLs
    whose host is a name other than ``localhost`` or a public IP literal: a loopback,
    private, link-local, CGNAT, unspecified or multicast IP (or plain ``http``) would let a
    hostile post make every guest that joins it send an HTTP request into the guest's own
    machine or network. (A public name that resolves to such an address is not caught
    here.) The owner's own relays (``--relay URL``) are checked against the owner's list
    instead, :meth:`node.transport.iroh.IrohNode.dial_addr`."""
    from urllib.parse import urlsplit

    try:
        u = urlsplit(str(url or ""))
        host = (u.hostname or "").rstrip(".")
        u.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError:
        return False
    if u.scheme != "https" or not host or host == "localhost" or host.endswith(".localhost"):
        return False
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return True  # a host name
    return not (ip.is_unspecified or ip.is_multicast or ip.is_reserved
                or any(ip in net for net in PRIVATE_NETWORKS if net.version == ip.version))


def ticket_addresses(ticket: str) -> tuple[str | None, list[str]]:
    """``(relay_url, direct addresses)`` of an iroh ticket string (parsed by iroh).

    Raises:
        ValueError: the ticket cannot be parsed.
    """
    import iroh

    try:
        addr = iroh.EndpointTicket.from_string(ticket).endpoint_addr()
    except Exception:  # noqa: BLE001 - iroh raises its own error type
        raise ValueError("bad ticket") from None
    relay = addr.relay_url()
    return (str(relay) if relay else None), [str(a) for a in addr.direct_addresses()]


__all__ = ["MAX_DIAL_ADDRS", "PRIVATE_NETWORKS", "dialable", "private_addresses", "relay_dialable",
           "ticket_addresses"]
