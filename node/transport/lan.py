"""LAN discovery over mDNS (specs/transport.md §6), on the ``zeroconf`` library.

A node in LAN mode with ``--discovery on`` advertises one service per endpoint:
``<first 32 hex of the endpoint id>._kith._udp.local.`` with TXT ``id=<64 hex>``, SRV
target ``kith-<first 32 hex>.local.`` whose A records are its LAN IPv4 addresses (the ones its own iroh endpoint observed) and its UDP port. A guest
with ``on`` or ``resolve`` asks for exactly that name before dialling and keeps the
answer only when its ``id`` is the endpoint id asked for and its addresses are on a
subnet of one of this machine's interfaces (:func:`on_my_subnets`). ``resolve`` never
advertises; ``off`` sends no multicast at all. Multicast goes out on the LAN interfaces
only (never loopback, which has none).
"""

from __future__ import annotations

import ipaddress
import logging
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Iterable

log = logging.getLogger("kith.lan")

#: The mDNS service type of Kith endpoints.
SERVICE_TYPE = "_kith._udp.local."
#: How long a guest waits for an mDNS answer before dialling what the ticket says (s).
RESOLVE_TIMEOUT_S = 3.0


def instance_name(endpoint_id: str) -> str:
    """The mDNS instance name of ``endpoint_id`` (64 hex): its first 32 hex digits."""
    return f"{endpoint_id[:32]}.{SERVICE_TYPE}"


def _interfaces() -> list[tuple[ipaddress.IPv4Interface, str]]:
    """This machine's IPv4 interfaces other than loopback, as ``(interface, name)``."""
    import ifaddr

    out = []
    for adapter in ifaddr.get_adapters():
        for ip in adapter.ips:
            if isinstance(ip.ip, str):
                iface = ipaddress.IPv4Interface(f"{ip.ip}/{ip.network_prefix}")
                if not iface.ip.is_loopback:
                    out.append((iface, adapter.nice_name))
    return out


def _lan_address(addr: str) -> tuple[ipaddress.IPv4Address, int] | None:
    """``(ip, port)`` of an ``IP:port`` string whose IPv4 address is private or link-local
    and not loopback; None for anything else (IPv6, a name, no port)."""
    host, _, port = str(addr).rpartition(":")
    try:
        ip = ipaddress.IPv4Address(host)
    except ValueError:
        return None
    if (ip.is_private or ip.is_link_local) and not ip.is_loopback and port.isdigit():
        return ip, int(port)
    return None


def on_my_subnets(addresses: Iterable[str]) -> list[str]:
    """The ``IP:port`` addresses whose IPv4 address is private or link-local and on the
    subnet of one of this machine's interfaces (an mDNS answer naming anything else is
    not dialled: specs/transport.md §5)."""
    nets = [iface.network for iface, _name in _interfaces()]
    out = []
    for addr in addresses:
        lan = _lan_address(addr)
        if lan is not None and any(lan[0] in net for net in nets):
            out.append(addr)
    return out


def _lan_ipv4(addresses: Iterable[str]) -> tuple[list[str], int | None]:
    """The private/link-local IPv4 addresses of ``IP:port`` strings and their port."""
    ips, port = [], None
    for addr in addresses:
        lan = _lan_address(addr)
        if lan is not None:
            ips.append(str(lan[0]))
            port = lan[1]
    return ips, port


@asynccontextmanager
async def advertised(endpoint_id: str, addresses: list[str]) -> AsyncIterator[bool]:
    """Advertise ``endpoint_id`` at its LAN ``addresses`` (``IP:port``, as its own endpoint
    observed them) for the ``with`` block; yields False (and advertises nothing) when it has
    no LAN address. The service is unregistered on exit (a goodbye packet)."""
    from zeroconf import IPVersion
    from zeroconf.asyncio import AsyncServiceInfo, AsyncZeroconf

    ips, port = _lan_ipv4(addresses)
    if not ips or port is None:
        yield False
        return
    azc = AsyncZeroconf(interfaces=ips, ip_version=IPVersion.V4Only)
    info = AsyncServiceInfo(SERVICE_TYPE, instance_name(endpoint_id), port=port,
                            addresses=[ipaddress.IPv4Address(ip).packed for ip in ips],
                            properties={"id": endpoint_id}, server=f"kith-{endpoint_id[:32]}.local.")
    try:
        await (await azc.async_register_service(info))  # probing and the first announcement done
        yield True
    finally:
        try:
            await (await azc.async_unregister_service(info))
        except Exception:  # noqa: BLE001 - the network went away meanwhile
            pass
        await azc.async_close()


async def resolve(endpoint_id: str, timeout_s: float = RESOLVE_TIMEOUT_S) -> list[str]:
    """Ask the LAN where ``endpoint_id`` is; never advertises anything.

    Returns:
        ``IP:port`` addresses of an answer whose TXT ``id`` is ``endpoint_id``, kept by
        :func:`on_my_subnets`; ``[]`` when nobody answered within ``timeout_s`` or this
        machine has no LAN interface.
    """
    from zeroconf import IPVersion
    from zeroconf.asyncio import AsyncServiceInfo, AsyncZeroconf

    ifaces = [str(iface.ip) for iface, _name in _interfaces()]
    if not ifaces:
        return []
    azc = AsyncZeroconf(interfaces=ifaces, ip_version=IPVersion.V4Only)
    try:
        info = AsyncServiceInfo(SERVICE_TYPE, instance_name(endpoint_id))
        if not await info.async_request(azc.zeroconf, timeout_s * 1000):
            return []
        props: dict[Any, Any] = info.properties or {}
        got = props.get(b"id") or props.get("id")
        if isinstance(got, bytes):
            got = got.decode("ascii", "replace")
        if got != endpoint_id or not info.port:
            return []
        found = [f"{ip}:{info.port}" for ip in info.parsed_addresses(IPVersion.V4Only)]
        return on_my_subnets(found)
    except Exception as exc:  # noqa: BLE001 - a LAN without multicast: fall back to the ticket
        log.debug("mDNS resolve failed: %s", type(exc).__name__)
        return []
    finally:
        await azc.async_close()


__all__ = ["RESOLVE_TIMEOUT_S", "SERVICE_TYPE", "advertised", "instance_name", "on_my_subnets", "resolve"]
